"""How deep shipped TorchScript source nests (csrc/script_dispatch/shipped_code.h):
torch's parser and compiler recurse once per level, so a callee refuses code
nested past kMaxShippedSourceDepth before compiling it. The bound must never
be below the real depth, and code torch prints must stay far under the cap."""

import io
import warnings
import zipfile

import pytest
import torch

from tests.csrc import hooks

warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in 2.13

CAP = 1000  # kMaxShippedSourceDepth


def depth(source):
    return hooks().shipped_source_depth(source)[0]


def test_chains_brackets_calls_and_indentation_each_count():
    assert depth("x = a\n") < depth("x = a + b\n") < depth("x = a + b * c - d\n")
    assert depth("x = (" * 50 + "a" + ")" * 50) >= 100
    assert depth("x = a" + "[0]" * 50) >= 50  # subscripts of subscripts
    assert depth("x = f" + "(a)" * 50) >= 50
    assert depth("x = " + "not " * 50 + "a") >= 50
    nested = "".join(" " * (2 * i) + "if a:\n" for i in range(40)) + " " * 80 + "pass\n"
    assert depth(nested) >= 40


def test_separators_and_leaves_do_not_add_up():
    long_list = "x = [" + ", ".join(str(i) for i in range(5000)) + "]\n"
    assert depth(long_list) < 10
    many_lines = "".join(f"x{i} = a + b\n" for i in range(5000))
    assert depth(many_lines) < 10
    assert depth("x = '" + "(+" * 5000 + "'\n# " + "(" * 5000 + "\n") < 10  # a string, a comment
    assert depth('x = """\n' + "(((\n" * 100 + '"""\n') < 10


def test_the_deepest_line_is_named():
    assert hooks().shipped_source_depth("a = 1\nb = 2\nc = " + "-" * 30 + "x\nd = 3\n")[1] == 3


def _printed_code(fn):
    archive = zipfile.ZipFile(io.BytesIO(fn.save_to_buffer()))
    return [archive.read(n).decode() for n in archive.namelist() if n.endswith(".py") and "/code/" in n]


def test_code_torch_prints_is_far_under_the_cap():
    @torch.jit.script
    def busy(x: torch.Tensor, n: int) -> torch.Tensor:
        for i in range(n):
            if bool(x.sum() > 0):
                x = torch.relu(x * 2 + 1) - torch.sigmoid(x).mean(dim=0, keepdim=True)
            else:
                x = torch.cat([x, x[:1] ** 2], dim=0)[: x.shape[0]]
        return (x + x * x - x / 2.0) @ x.t()

    sources = _printed_code(busy)
    assert sources and max(depth(s) for s in sources) < CAP // 20


@pytest.mark.parametrize("source", ["(" * 20000 + "x" + ")" * 20000, "x + " * 20000 + "x"])
def test_what_overflows_torchs_stack_is_over_the_cap(source):
    # Both crashed torch.jit.load with SIGSEGV (an 8 MB stack) when torch compiled them.
    assert depth(f"def f(x):\n  return {source}\n") > CAP

"""The TorchScript functional optimizers follow torch.optim step for step.

Each case runs torch.optim.<Name> on one copy of some parameters (gradients in
``.grad``) and the functional optimizer built by ``functional_optimizer`` on
another (gradients passed to ``step``), then compares parameters and state
after every step.
"""

import threading

import pytest
import torch

from torchrpc.optim.functional import (
    FunctionalAdagrad,
    FunctionalAdam,
    FunctionalRMSprop,
    FunctionalSGD,
    functional_optimizer,
)

SHAPES = [(5, 3), (4,), (2, 3, 2), (1,)]
STEPS = 5
# Tight enough that a wrong eps, bias correction or dampening shows; the math
# is op for op the same, so float hyper-parameters agree to the last bit.
TOL = {"rtol": 1e-6, "atol": 1e-7}

# torch.optim state key -> attribute of the functional optimizer.
STATE_ATTRS = {
    "momentum_buffer": "momentum_buffers",
    "step": "steps",
    "exp_avg": "exp_avgs",
    "exp_avg_sq": "exp_avg_sqs",
    "max_exp_avg_sq": "max_exp_avg_sqs",
    "sum": "sums",
    "square_avg": "square_avgs",
    "grad_avg": "grad_avgs",
}


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).requires_grad_() for s in SHAPES]


def _gradients(seed=1):
    """STEPS lists of gradients; None where (step + index) % 3 == 0.

    So parameter 0 gets no gradient on the first step (its state starts later)
    and every parameter misses at least one step.
    """
    gen = torch.Generator().manual_seed(seed)
    return [
        [
            None if (step + i) % 3 == 0 else torch.randn(s, generator=gen)
            for i, s in enumerate(SHAPES)
        ]
        for step in range(STEPS)
    ]


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


def _assert_state_matches(reference, functional, params, tol):
    for i, p in enumerate(params):
        state = reference.state.get(p, {})
        for key, attr in STATE_ATTRS.items():
            ours = functional.getattr(attr)[i] if functional.hasattr(attr) else None
            if key not in state:
                # No state in torch yet: ours is unset too (None, or step 0).
                if attr == "steps":
                    assert ours in (None, 0.0), f"param {i}: step {ours}, torch has no state"
                elif attr != "sums" and ours is not None:
                    raise AssertionError(f"param {i}: {attr} set, torch has no {key}")
                continue
            expected = state[key]
            if key == "step":
                assert ours == float(expected), f"param {i}: step {ours} != {expected}"
            else:
                assert ours is not None, f"param {i}: {attr} is None, torch has {key}"
                torch.testing.assert_close(ours, expected, **tol, msg=lambda m: f"{attr}[{i}]: {m}")


def _compare(optimizer_class, args, kwargs, tol=TOL, step_in=None):
    """Steps both optimizers STEPS times, comparing after every step."""
    ref_params = _params()
    our_params = _clone(ref_params)
    reference = optimizer_class(ref_params, *args, **kwargs)
    functional = functional_optimizer(optimizer_class, our_params, *args, **kwargs)
    assert isinstance(functional, torch.ScriptObject), functional
    for step, grads in enumerate(_gradients()):
        for p, g in zip(ref_params, grads):
            p.grad = None if g is None else g.clone()
        reference.step()
        ours = [None if g is None else g.clone() for g in grads]
        if step_in is None:
            functional.step(ours)
        else:
            step_in(functional, ours)
        for i, (mine, theirs) in enumerate(zip(our_params, ref_params)):
            torch.testing.assert_close(
                mine, theirs, **tol, msg=lambda m: f"step {step}, param {i}: {m}"
            )
        _assert_state_matches(reference, functional, ref_params, tol)
    # Every parameter moved, so the comparison above is not vacuous.
    for p, start in zip(our_params, _params()):
        assert not torch.equal(p, start)


CASES = [
    # (optimizer, positional args after params, keyword args)
    (torch.optim.SGD, (), {}),
    (torch.optim.SGD, (0.1,), {}),
    (torch.optim.SGD, (0.1, 0.9), {}),
    (torch.optim.SGD, (), {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}),
    (torch.optim.SGD, (0.1, 0.9, 0.0, 0.0, True), {}),
    (torch.optim.SGD, (), {"lr": 0.1, "weight_decay": 0.1}),
    (torch.optim.SGD, (), {"lr": 0.1, "maximize": True}),
    (torch.optim.SGD, (0.1, 0.8, 0.0, 0.05, True), {"maximize": True, "foreach": False}),
    (torch.optim.SGD, (), {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.05, "foreach": True}),
    (torch.optim.Adam, (), {}),
    (torch.optim.Adam, (0.1,), {}),
    (torch.optim.Adam, (0.1, (0.8, 0.9), 1e-3), {}),
    (torch.optim.Adam, (), {"lr": 0.1, "weight_decay": 0.1}),
    (torch.optim.Adam, (), {"lr": 0.1, "amsgrad": True}),
    (torch.optim.Adam, (), {"lr": 0.1, "maximize": True}),
    (torch.optim.Adam, (0.05, (0.9, 0.99), 1e-8, 0.1, True), {"maximize": True}),
    (torch.optim.Adam, (), {"lr": 0.1, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    (torch.optim.AdamW, (), {}),
    (torch.optim.AdamW, (0.1,), {}),
    (torch.optim.AdamW, (), {"lr": 0.1, "weight_decay": 0.3, "amsgrad": True}),
    (torch.optim.AdamW, (0.1, (0.8, 0.95), 1e-6, 0.0), {"maximize": True, "foreach": False}),
    (torch.optim.Adagrad, (), {}),
    (torch.optim.Adagrad, (0.1, 0.1), {}),
    (torch.optim.Adagrad, (), {"lr": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-3}),
    (torch.optim.Adagrad, (), {"lr": 0.1, "weight_decay": 0.1, "maximize": True}),
    (torch.optim.Adagrad, (0.1, 0.05, 0.01, 0.1, 1e-6, False), {"maximize": True}),
    (torch.optim.RMSprop, (), {}),
    (torch.optim.RMSprop, (0.05, 0.9), {}),
    (torch.optim.RMSprop, (), {"lr": 0.05, "momentum": 0.9}),
    (torch.optim.RMSprop, (), {"lr": 0.05, "centered": True}),
    (torch.optim.RMSprop, (), {"lr": 0.05, "weight_decay": 0.1, "maximize": True}),
    (torch.optim.RMSprop, (0.01, 0.95, 1e-4, 0.05, 0.5, True, False, False, True), {}),
]


def _case_id(case):
    cls, args, kwargs = case
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{cls.__name__}({', '.join(parts)})"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_matches_torch_optim(case):
    _compare(*case)


# A 1-element tensor lr (and betas) is read as a float; torch computes with it
# as a float32 tensor in places (lr / bias_correction), so allow float32 rounding.
TENSOR_CASES = [
    (torch.optim.SGD, (torch.tensor(0.05),), {"momentum": 0.9}),
    (torch.optim.Adam, (), {"lr": torch.tensor(0.05), "amsgrad": True}),
    (torch.optim.Adam, (), {"lr": 0.05, "betas": (torch.tensor(0.8), torch.tensor(0.9))}),
    (torch.optim.AdamW, (torch.tensor([0.05]),), {"weight_decay": 0.1}),
    (torch.optim.Adagrad, (torch.tensor(0.1),), {"lr_decay": 0.1}),
    (torch.optim.RMSprop, (torch.tensor(0.05),), {"momentum": 0.5, "centered": True}),
]


@pytest.mark.parametrize("case", TENSOR_CASES, ids=[_case_id(c) for c in TENSOR_CASES])
def test_tensor_hyper_parameters_match_torch_optim(case):
    _compare(*case, tol={"rtol": 1e-5, "atol": 1e-6})


def test_step_from_another_thread():
    errors = []

    def step_in_thread(functional, grads):
        def run():
            try:
                functional.step(grads)
            except BaseException as e:  # reported below, on the main thread
                errors.append(e)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive(), "step did not return within 10 s"
        if errors:
            raise errors[0]

    _compare(torch.optim.Adam, (), {"lr": 0.1, "amsgrad": True}, step_in=step_in_thread)


def _sparse_gradient(shape, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    # A repeated row: the optimizers must coalesce before a non-linear update.
    indices = torch.tensor([rows])
    values = torch.randn((len(rows),) + tuple(shape[1:]), generator=gen)
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


@pytest.mark.parametrize(
    "optimizer_class, kwargs",
    [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.Adagrad, {"lr": 0.1, "maximize": True})],
)
def test_sparse_gradients_match_torch_optim(optimizer_class, kwargs):
    ref = [torch.randn(6, 3, generator=torch.Generator().manual_seed(0)).requires_grad_()]
    ours = _clone(ref)
    start = ref[0].detach().clone()
    reference = optimizer_class(ref, **kwargs)
    functional = functional_optimizer(optimizer_class, ours, **kwargs)
    for step, rows in enumerate([[0, 2, 2], [5, 1, 0]]):
        grad = _sparse_gradient((6, 3), rows, seed=step)
        ref[0].grad = grad.clone()
        # torch's Adagrad builds sparse tensors without choosing whether to
        # check their invariants, which warns; choose for it.
        with torch.sparse.check_sparse_tensor_invariants():
            reference.step()
        functional.step([grad.clone()])
        torch.testing.assert_close(ours[0], ref[0], **TOL)
    assert not torch.equal(ours[0][2], start[2])
    assert torch.equal(ours[0][3], start[3]), "a row without gradient moved"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: FunctionalAdam(p), "Adam does not support sparse gradients"),
        (lambda p: FunctionalAdam(p, decoupled_weight_decay=True), "Adam does not support sparse gradients"),
        (lambda p: FunctionalRMSprop(p), "RMSprop does not support sparse gradients"),
        (
            lambda p: FunctionalAdagrad(p, weight_decay=0.1),
            "weight_decay option is not compatible with sparse gradients",
        ),
    ],
)
def test_unsupported_sparse_gradient_raises_before_any_update(make, message):
    params = [torch.ones(4), torch.ones(6, 3)]
    functional = make(params)
    with pytest.raises(torch.jit.Error, match=message):
        functional.step([torch.ones(4), _sparse_gradient((6, 3), [1], seed=0)])
    assert torch.equal(params[0], torch.ones(4)), "the dense parameter was updated"


def test_gradient_count_mismatch_raises():
    params = [torch.ones(2), torch.ones(3)]
    functional = FunctionalSGD(params, lr=0.1)
    with pytest.raises(torch.jit.Error, match="2 parameters, got 1 gradients"):
        functional.step([torch.ones(2)])
    assert torch.equal(params[0], torch.ones(2))


def test_is_script_object_with_step_method():
    params = [torch.zeros(3)]
    functional = FunctionalSGD(params, 0.5)
    assert isinstance(functional, torch.ScriptObject)
    assert functional._type().qualified_name() == (
        "__torch__.torchrpc.optim.functional.sgd.FunctionalSGD"
    )
    assert FunctionalSGD.is_instance(functional)
    assert not FunctionalAdam.is_instance(functional)
    schema = str(functional._get_method("step").schema)
    assert "Tensor?[] gradients" in schema and "-> NoneType" in schema
    # Parameters are aliased, not copied; lr is a writable attribute.
    functional.step([torch.ones(3)])
    torch.testing.assert_close(params[0], torch.full((3,), -0.5))
    functional.setattr("lr", 0.25)
    functional.step([torch.ones(3)])
    torch.testing.assert_close(params[0], torch.full((3,), -0.75))


def test_step_leaves_grad_mode_and_gradients_alone():
    param = torch.zeros(3, requires_grad=True)
    grad = torch.ones(3)
    functional = FunctionalSGD([param], lr=0.1, momentum=0.9, weight_decay=0.1, maximize=True)
    functional.step([grad])
    functional.step([grad])
    assert torch.equal(grad, torch.ones(3))
    assert torch.is_grad_enabled()
    assert param.grad is None and param.requires_grad


class _MySGD(torch.optim.SGD):
    pass


@pytest.mark.parametrize(
    "optimizer_class, args, kwargs",
    [
        (torch.optim.LBFGS, (), {}),
        (torch.optim.Adadelta, (), {}),
        (_MySGD, (0.1,), {}),
        (torch.optim.SGD, (0.1,), {"fused": True}),
        (torch.optim.SGD, (0.1,), {"differentiable": True}),
        (torch.optim.Adam, (), {"capturable": True}),
        (torch.optim.Adam, (), {"fused": True}),
        (torch.optim.AdamW, (), {"differentiable": True}),
        (torch.optim.Adagrad, (), {"fused": True}),
        (torch.optim.RMSprop, (), {"capturable": True}),
        (torch.optim.SGD, (torch.tensor(0.1, requires_grad=True),), {}),
    ],
)
def test_factory_returns_none_when_unsupported(optimizer_class, args, kwargs):
    assert functional_optimizer(optimizer_class, _params(), *args, **kwargs) is None


def test_factory_returns_none_for_param_groups_and_complex_params():
    params = _params()
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": 0.5}]
    assert functional_optimizer(torch.optim.SGD, groups, lr=0.1) is None
    assert functional_optimizer(torch.optim.Adam, [torch.zeros(2, dtype=torch.cfloat)]) is None


def test_factory_accepts_a_generator_of_params():
    params = _params()
    functional = functional_optimizer(torch.optim.SGD, iter(params), lr=0.1)
    assert len(functional.params) == len(params)
    assert all(a is b for a, b in zip(functional.params, params))


INVALID = [
    (torch.optim.SGD, (-0.1,), {}, "Invalid learning rate: -0.1"),
    (torch.optim.SGD, (0.1,), {"nesterov": True}, "Nesterov momentum requires a momentum"),
    (torch.optim.SGD, (0.1, -0.9), {}, "Invalid momentum value: -0.9"),
    (torch.optim.Adam, (), {"betas": (1.0, 0.999)}, "Invalid beta parameter at index 0: 1.0"),
    (torch.optim.Adam, (), {"weight_decay": -1}, "Invalid weight_decay value: -1"),
    (torch.optim.AdamW, (), {"eps": -1e-8}, "Invalid epsilon value: -1e-08"),
    (torch.optim.Adagrad, (), {"lr_decay": -0.5}, "Invalid lr_decay value: -0.5"),
    (torch.optim.Adagrad, (), {"initial_accumulator_value": -1.0}, "Invalid initial_accumulator"),
    (torch.optim.RMSprop, (), {"alpha": -0.5}, "Invalid alpha value: -0.5"),
    (torch.optim.SGD, (torch.ones(2),), {}, "Tensor lr must be 1-element"),
]


@pytest.mark.parametrize("optimizer_class, args, kwargs, message", INVALID)
def test_invalid_hyper_parameters_raise_like_torch(optimizer_class, args, kwargs, message):
    params = _params()
    with pytest.raises(ValueError, match=message) as ours:
        functional_optimizer(optimizer_class, params, *args, **kwargs)
    with pytest.raises(ValueError) as theirs:
        optimizer_class(params, *args, **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_unknown_argument_raises_type_error_like_torch():
    with pytest.raises(TypeError, match="unexpected keyword argument 'momentun'"):
        functional_optimizer(torch.optim.SGD, _params(), lr=0.1, momentun=0.9)


def test_empty_params_raise_like_torch():
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        functional_optimizer(torch.optim.Adam, [])
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        FunctionalAdam([])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: FunctionalSGD(p, lr=-1.0), "FunctionalSGD: Invalid learning rate"),
        (lambda p: FunctionalAdam(p, betas=(0.9, 1.5)), "Invalid beta parameter at index 1"),
        (lambda p: FunctionalRMSprop(p, eps=-1.0), "Invalid epsilon value"),
    ],
)
def test_direct_construction_validates(make, message):
    with pytest.raises(ValueError, match=message):
        make(_params())


@pytest.mark.parametrize("case", [c for c in CASES if not c[1] and not c[2]], ids=_case_id)
def test_factory_leaves_params_untouched(case):
    optimizer_class, args, kwargs = case
    params = _params()
    functional_optimizer(optimizer_class, params, *args, **kwargs)
    for p, start in zip(params, _params()):
        assert torch.equal(p, start) and p.grad is None and p.requires_grad

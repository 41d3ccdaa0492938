"""A link delay in user space, for kernels without netem (sch_netem).

    python -m tests.multiprocess.delay_line DEV_A DEV_B DELAY_FILE
        forwards every Ethernet frame between DEV_A and DEV_B (the two
        interfaces of a middle namespace), each after the delay in seconds
        that DELAY_FILE holds (read every 50 ms; 0 when absent).
    python -m tests.multiprocess.delay_line --offloads-off DEV...
        turns off checksum and segmentation offloads of DEV (what
        `ethtool -K DEV tx off tso off gso off gro off` does): a frame that
        crosses user space must carry its own checksum and fit the MTU.
"""

import ctypes
import fcntl
import heapq
import os
import select
import socket
import struct
import sys
import time

ETH_P_ALL = 3
SIOCETHTOOL = 0x8946
ETHTOOL_OFF = (0x17, 0x1F, 0x24, 0x2C)  # STXCSUM, STSO, SGSO, SGRO


def offloads_off(devices):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for dev in devices:
        for cmd in ETHTOOL_OFF:
            value = ctypes.create_string_buffer(struct.pack("II", cmd, 0))
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, struct.pack("16sP", dev.encode(), ctypes.addressof(value)))


def read_delay(path):
    try:
        with open(path) as f:
            return float(f.read() or 0)
    except (OSError, ValueError):
        return 0.0


def forward(dev_a, dev_b, delay_file):
    socks = []
    for dev in (dev_a, dev_b):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.bind((dev, 0))
        s.setblocking(False)
        socks.append(s)
    other = {socks[0].fileno(): socks[1], socks[1].fileno(): socks[0]}
    by_fd = {s.fileno(): s for s in socks}
    poll = select.epoll()
    for s in socks:
        poll.register(s.fileno(), select.EPOLLIN)
    queue, seq = [], 0  # (due, seq, out socket, frame): in order per direction
    delay, checked = read_delay(delay_file), time.monotonic()
    while True:
        now = time.monotonic()
        if now - checked > 0.05:
            delay, checked = read_delay(delay_file), now
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            try:
                out.send(frame)
            except OSError:
                pass  # a link that is down drops the frame, as a wire would
        timeout = min(0.05, max(0.0, queue[0][0] - now)) if queue else 0.05
        for fd, _ in poll.poll(timeout):
            while True:
                try:
                    frame, address = by_fd[fd].recvfrom(65536)
                except (BlockingIOError, OSError):
                    break
                if address[2] == socket.PACKET_OUTGOING:
                    continue  # what this process sent
                seq += 1
                heapq.heappush(queue, (time.monotonic() + delay, seq, other[fd], frame))


def main():
    if sys.argv[1] == "--offloads-off":
        offloads_off(sys.argv[2:])
    else:
        forward(*sys.argv[1:4])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

"""Run in the guest by test_guest_vm.py (not collected: no test_ prefix): the outsourced
socket's operations that kbp_so.ko serves so far, and the ones it refuses."""

import errno
import socket
import subprocess

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 253)
assert s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_UDP
s.bind(("127.0.0.1", 0))
host, port = s.getsockname()
assert host == "127.0.0.1" and port > 0, (host, port)
print("KBP-SO-BOUND", port, flush=True)
try:
    s.sendto(b"x", ("127.0.0.1", 9))
except OSError as e:
    assert e.errno == errno.EOPNOTSUPP, e
else:
    raise AssertionError("sendmsg is not outsourced yet and must say so")
# the host's own errors come back: a second bind is EINVAL, as for a local socket
try:
    s.bind(("127.0.0.1", 0))
except OSError as e:
    assert e.errno == errno.EINVAL, e
else:
    raise AssertionError("a second bind succeeded")
# an open outsourced socket holds the module
rc = subprocess.run(["rmmod", "kbp_so"], capture_output=True).returncode
assert rc != 0, "rmmod succeeded with an outsourced socket open"
s.close()
print("KBP-SO-GUEST-OK", flush=True)

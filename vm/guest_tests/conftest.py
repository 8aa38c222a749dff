"""PLACEHOLDER -- the real conftest.py of the in-guest tests was destroyed by accident.

The lead's conftest.py (created 2026-11-22 08:55:36, uncommitted) was overwritten at
09:01:23 by the VM-rig helper, who did not know it already existed (it wrote a 20-line
skip-on-host conftest with `cat >`).  Its content could not be recovered: it is not in git,
there is no .pyc, and the raw disk is not readable.  Please restore it from your session
(test_poller.py, test_faults.py, test_bad_input.py and test_citizenship.py import NS,
POLL_CPU, SERVER_IP, UDPFLOW, Topo, Flow, build_topology, sh, spawn, stop, wait_for,
task_state, task_cpu_ticks, net_rx_softirqs, dmesg_lines, dmesg_since, kbp_threads,
load_module, module_loaded, traffic_flows, udp_seen and the kmod/topo/flow fixtures).
Sorry.  Until then, importing this file fails loudly rather than with a puzzling
ImportError.  (vm/guest_tests/test_rig.py does not need anything from conftest.)
"""

raise ImportError(
    "vm/guest_tests/conftest.py is a placeholder: the lead's original was overwritten by "
    "mistake at 09:01 (see the docstring of this file); restore it from your session")

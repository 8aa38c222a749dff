"""kbp socket outsourcing, the operator's side: the BPF policy that picks the sockets
(docs/design.md 11.1, "The policy as built") and the guest module's /proc/kbp_so.

Standard library only (ctypes, struct): no clang, libbpf or bpftool on the machines, and
``kbpctl outsource`` starts fast in a TCG guest.
"""

"""kbp VM rig: boot Debian kernels under QEMU (TCG) and run commands or tests inside them.

Run ``python3 -m vm --help`` from the repository root.  Subcommands:

* ``setup``  -- apt-install the host packages the rig needs (also ``vm/setup.sh``);
* ``fetch``  -- download + extract a kernel flavour (image, modules, headers) into the cache;
* ``build``  -- build an out-of-tree module against a flavour's headers;
* ``run``    -- boot a flavour with two hub-joined virtio-net NICs and run one command;
* ``test``   -- fetch + build + run the in-guest pytest suite on one or more flavours.

The guest sees the host's root filesystem read-only over virtio-9p with a tmpfs overlay on
top, so every host tool (python3, pytest, iproute2, ethtool, sockperf ...) is available in
the guest at its usual path, and the repository is at the same path as on the host.
"""

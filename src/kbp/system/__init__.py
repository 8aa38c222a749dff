"""The one layer through which kbp touches the machine.

- :mod:`kbp.system.access`: run a command, read and write a file under /sys or /proc (in a
  network namespace too), and the in-process restore journal (``Journal.defer``);
- :mod:`kbp.system.settings`: one handler per kind of setting (sysfs attribute, NAPI, IRQ
  affinity, scheduling, ...), each with ``get`` and ``set`` over a typed key;
- :mod:`kbp.system.journal`: kbpctl's write-ahead journal on disk (``/run/kbp``), which
  ``disable`` and crash recovery replay through the handlers.

A file of the kernel is written only through :func:`kbp.system.access.write`
(``tests/test_system_layer.py`` holds every other module to that).
"""

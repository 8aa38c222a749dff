"""The kernel's own YNL library (tools/net/ynl) speaking kbp from module/netlink/kbp.yaml.

Run with a Python that has PyYAML (ynl needs it; kbp's venv does not):

    python3 ynl_kbp.py YNL_DIR SPEC offline < cases.json   # no module: encode and decode
    python3 ynl_kbp.py YNL_DIR SPEC live                   # the loaded module: two dumps

YNL_DIR holds the kernel source's tools/net/ynl (and Documentation/netlink, for the schema).
Offline, the family id is made up (nothing asks the kernel): each case of the JSON on stdin
is either ``{"encode": OP, "attrs": {...}}`` (prints the request's attributes as hex) or
``{"decode": HEX}`` (prints the attributes of a reply, decoded in the set "kbp"). Prints one
JSON document: {"schema": checked or why not, "ops": [...], "results": [...]}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main() -> int:
    ynl_dir, spec, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    sys.path.insert(0, str(ynl_dir / "tools/net/ynl"))
    from lib import ynl  # type: ignore[import-not-found]
    from lib.nlspec import SpecFamily  # type: ignore[import-not-found]

    out: dict[str, Any] = {}
    schema = ynl_dir / "Documentation/netlink/genetlink-legacy.yaml"
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        out["schema"] = "not checked: no jsonschema"
    else:
        SpecFamily(spec, str(schema))    # raises when the spec breaks the kernel's schema
        out["schema"] = "valid"
    if mode == "offline":
        ynl.genl_family_name_to_id = {"kbp": {"id": 0x20, "mcast": {}}}
    # process_unknown: 6.12's decoder has no case for type pad, which the module sends only
    # where u64s need aligning (not on x86-64); with it, a pad decodes as b""
    fam = ynl.YnlFamily(spec, schema="", process_unknown=True)
    out["ops"] = list(fam.ops)
    results: list[Any] = []
    if mode == "offline":
        for case in json.load(sys.stdin):
            if "encode" in case:
                msg = fam._encode_message(fam.ops[case["encode"]], case["attrs"], None, 1)
                results.append(msg[20:].hex())     # past nlmsghdr and genlmsghdr
            else:
                attrs = ynl.NlAttrs(bytes.fromhex(case["decode"]))
                results.append(fam._decode(attrs, "kbp"))
    else:
        results = [fam.dump("poller-get", {}), fam.dump("dev-get", {})]
    out["results"] = results
    print(json.dumps(out, default=lambda b: b.hex() if isinstance(b, bytes) else str(b)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The generic netlink controller's message with its policy attributes, on any pyroute2.

``CTRL_CMD_GETPOLICY`` replies carry ``CTRL_ATTR_POLICY`` and ``CTRL_ATTR_OP_POLICY``,
which pyroute2 0.9 (the venv's) decodes. Debian 12 ships pyroute2 0.7.2 (the ``kbpctl``
package depends on it): its ``ctrlmsg`` stops at ``CTRL_ATTR_MCAST_GROUPS`` and it has no
``CTRL_CMD_GETPOLICY``. There ``ctrlmsg`` here is pyroute2's with those attributes added
through static maps, decoded under the names newer pyroute2 gives them (``POLICY(i)``,
``ATTR(i)``, ``OP(i)``), so kbp.netdev reads either the same way.
"""

from __future__ import annotations

import pyroute2.netlink as _nl

#: the kernel's value (include/uapi/linux/genetlink.h)
CTRL_CMD_GETPOLICY: int = getattr(_nl, "CTRL_CMD_GETPOLICY", 0xA)

#: policy indexes and attribute ids decoded by the static maps (netdev's napi-set has
#: fewer than 16 attributes and one policy; others decode as unknown attributes)
_MAX_INDEX = 64


def _indexed(fmt: str, cls: str) -> tuple[tuple[str, str], ...]:
    return tuple((fmt.format(i), cls) for i in range(_MAX_INDEX))


class _ctrlmsg(_nl.ctrlmsg):
    """Debian 12's ``ctrlmsg`` plus the policy attributes (ids 8..10)."""

    __slots__ = ()
    # pyroute2 compiles a class's nla_map once and marks the class; the mark is inherited,
    # so a subclass of an already compiled ctrlmsg must clear it to get its own map
    _nlmsg_base__compiled_nla = False

    nla_map = (*_nl.ctrlmsg.nla_map[:8],
               ("CTRL_ATTR_POLICY", "policy_nest"),
               ("CTRL_ATTR_OP_POLICY", "command_nest"),
               ("CTRL_ATTR_OP", "uint32"))

    class policy_nest(_nl.nla):
        __slots__ = ()

        class attribute_nest(_nl.nla):
            __slots__ = ()

            class nl_policy_type_attr(_nl.nla):
                __slots__ = ()
                nla_map = (
                    ("NL_POLICY_TYPE_ATTR_UNSPEC", "none"),
                    ("NL_POLICY_TYPE_ATTR_TYPE", "uint32"),
                    ("NL_POLICY_TYPE_ATTR_MIN_VALUE_S", "int64"),
                    ("NL_POLICY_TYPE_ATTR_MAX_VALUE_S", "int64"),
                    ("NL_POLICY_TYPE_ATTR_MIN_VALUE_U", "int64"),
                    ("NL_POLICY_TYPE_ATTR_MAX_VALUE_U", "int64"),
                    ("NL_POLICY_TYPE_ATTR_MIN_LENGTH", "uint32"),
                    ("NL_POLICY_TYPE_ATTR_MAX_LENGTH", "uint32"),
                    ("NL_POLICY_TYPE_ATTR_POLICY_IDX", "uint32"),
                    ("NL_POLICY_TYPE_ATTR_POLICY_MAXTYPE", "uint32"),
                    ("NL_POLICY_TYPE_ATTR_BITFIELD32_MASK", "uint32"),
                    ("NL_POLICY_TYPE_ATTR_PAD", "uint64"),
                    ("NL_POLICY_TYPE_ATTR_MASK", "uint64"),
                )

            nla_map = _indexed("ATTR({})", "nl_policy_type_attr")

        nla_map = _indexed("POLICY({})", "attribute_nest")

    class command_nest(_nl.nla):
        __slots__ = ()

        class command_nest_attrs(_nl.nla):
            __slots__ = ()
            nla_map = (
                ("CTRL_ATTR_POLICY_UNSPEC", "none"),
                ("CTRL_ATTR_POLICY_DO", "uint32"),
                ("CTRL_ATTR_POLICY_DUMP", "uint32"),
            )

        nla_map = _indexed("OP({})", "command_nest_attrs")


def _decodes_policies() -> bool:
    return any(name == "CTRL_ATTR_POLICY" for name, *_ in _nl.ctrlmsg.nla_map)


ctrlmsg = _nl.ctrlmsg if _decodes_policies() else _ctrlmsg

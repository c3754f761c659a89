"""What a ``UCX_TLS`` value means, in UCX's syntax and aliases and to distributed-ucxx, so every
plugin reads a user's value the same way.  Re-exported by :mod:`gpudask.pluginapi`.
"""

from __future__ import annotations

# What each UCX_TLS name (ucx_info -c / UCX docs) lets UCX use, in the transports gpudask
# reasons about: "rc" stands for InfiniBand whatever the verbs flavour (rc or dc).
_MEANS: dict[str, frozenset[str]] = {
    "all": frozenset({"tcp", "cuda_copy", "cuda_ipc", "rc"}),
    "cuda": frozenset({"cuda_copy", "cuda_ipc"}),
    "ib": frozenset({"rc"}),
    "rc": frozenset({"rc"}), "rc_v": frozenset({"rc"}), "rc_x": frozenset({"rc"}),
    "rc_verbs": frozenset({"rc"}), "rc_mlx5": frozenset({"rc"}),
    "dc": frozenset({"rc"}), "dc_x": frozenset({"rc"}), "dc_mlx5": frozenset({"rc"}),
}


def parse_ucx_tls(value: str | None) -> list[str]:
    """``" TCP, cuda_copy"`` -> ``["tcp", "cuda_copy"]``: names lower-cased, order kept.

    A leading ``^`` (UCX: every transport *but* these) stays on the first name as given:
    ``"^cuda,tcp"`` -> ``["^cuda", "tcp"]``.  ``None`` or ``""`` -> ``[]``.
    """
    return [name.strip().lower() for name in (value or "").split(",") if name.strip()]


def tls_enables(tls: str | None, transport: str) -> bool:
    """Does a UCX_TLS value let UCX use ``transport`` (tcp, cuda_copy, cuda_ipc, rc)?

    Aliases are expanded (``cuda``, ``ib``, ``all``; ``rc_mlx5``, ``dc``... mean InfiniBand,
    written ``rc``), a leading ``^`` negates the list.  An unset or empty UCX_TLS lets UCX
    choose among everything.
    """
    names = parse_ucx_tls(tls)
    if not names:
        return True
    negate = names[0].startswith("^")
    if negate:
        names[0] = names[0][1:]
    named = any(transport in _MEANS.get(n.rstrip("\\"), frozenset({n.rstrip("\\")})) for n in names)
    return named != negate


def ucxx_creates_cuda_context(tls: str | None) -> bool:
    """distributed-ucxx's own test (``init_once``) on UCX_TLS: a name containing ``cuda``
    and no ``^cuda``.  Not UCX's meaning of the value: what distributed-ucxx will do."""
    names = parse_ucx_tls(tls)
    return any("cuda" in n for n in names) and not any(n.startswith("^cuda") for n in names)


# Every name UCX_TLS accepts whatever the host (UCX 1.12-1.18 docs, ``ucx_info -c``); any other
# must be one this host's UCX offers (gpudask_ucx_offered)
UCX_TLS_NAMES = frozenset({
    "all", "sm", "shm", "mm", "posix", "sysv", "xpmem", "cma", "knem", "self", "tcp",
    "ib", "rc", "rc_v", "rc_verbs", "rc_x", "rc_mlx5", "ud", "ud_v", "ud_verbs", "ud_x", "ud_mlx5",
    "dc", "dc_x", "dc_mlx5", "srd", "ugni", "ugni_rdma", "ugni_udt", "ugni_smsg",
    "cuda", "cuda_copy", "cuda_ipc", "gdr_copy", "rocm", "rocm_copy", "rocm_ipc", "rocm_gdr",
    "ze_copy", "ze_ipc", "ze_gdr", "sockcm", "rdmacm", "cuda_ipc_cache",
})


def check_user_tls(value: str | None, host_transports: list[str] | None) -> None:
    """:raises ConfigError: one line for a UCX_TLS UCX cannot start with: set but empty
    (``UCXXNoElemError``), or naming transports neither UCX's names nor ``host_transports``
    (what the plugins say this host's UCX offers, when known) have."""
    from gpudask.errors import ConfigError

    if value is None:
        return
    if not value.strip():
        raise ConfigError("UCX_TLS is set but empty: UCX then has no transport and ucx:// cannot start "
                          "(UCXXNoElemError); accepted: unset it (gpudask chooses) or a comma-separated list of "
                          "transports, e.g. UCX_TLS=tcp")
    known = set(UCX_TLS_NAMES) | {t.lower() for t in host_transports or []}
    names = parse_ucx_tls(value)
    if names and names[0].startswith("^"):
        names[0] = names[0][1:]
    bad = [n for n in names if n.split(":", 1)[0].rstrip("\\") not in known]
    if bad:
        offered = f"this host's UCX offers {', '.join(sorted(host_transports))}; " if host_transports else ""
        raise ConfigError(f"UCX_TLS={value!r:.200} names unknown transport(s) {', '.join(repr(b) for b in bad)}; "
                          f"accepted: {offered}UCX's names {', '.join(sorted(UCX_TLS_NAMES))}, comma-separated "
                          "(a leading ^ excludes)")


"""EFA devices as libfabric sees them: `fi_info -p efa -t FI_EP_RDM`.

fi_info prints one block per (fabric, domain, endpoint type): `provider: efa`, then indented `fabric:`,
`domain: rdmap79s0-rdm`, `version:`, `type: FI_EP_RDM`, `protocol: FI_PROTO_EFA`. Recent libfabric lists each
device twice, under the `efa` and `efa-direct` fabrics, so devices are counted as distinct RDM domains, not
blocks. The AWS EFA guide uses this command to check that the EFA software sees the devices.
"""

from __future__ import annotations

FI_INFO_ARGS = ("-p", "efa", "-t", "FI_EP_RDM")


def parse_fi_info(text: str) -> list[dict[str, str]]:
    """The blocks of fi_info's default output as dicts (provider, fabric, domain, version, type, protocol)."""
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "provider":
            blocks.append({"provider": value})
        elif blocks:
            blocks[-1][key] = value
    return blocks


def efa_rdm_domains(text: str) -> list[str]:
    """The distinct EFA RDM domains (one per EFA device), sorted."""
    domains = {
        b["domain"]
        for b in parse_fi_info(text)
        if b.get("provider") == "efa" and b.get("type") == "FI_EP_RDM" and b.get("domain")
    }
    return sorted(domains)

"""Can the job user open a TCP connection to the instance metadata service? Run by the check `imds-block`.

    python3 -I metadata_probe.py --uid 998 --gid 998 [--groups 44,997] [--timeout-s 2] 169.254.169.254:80 ...

Started as root, it takes the job user's identity first (supplementary groups, gid, uid: what the job
supervisor does before it runs a job), so every socket it opens belongs to that uid, the key the owner-matched
firewall rule of step `imdsblock` (imds_block.py) decides on. Then it tries each ADDRESS:PORT once
(`[fd00:ec2::254]:80` for IPv6) and prints one JSON object:
    {"uid": 998, "targets": [{"target": "169.254.169.254:80", "connected": false, "error": "..."}]}
Exit 0 once every target was tried, 2 for bad arguments or an identity it could not take.

Standalone (stdlib only, run by path): it imports nothing else from the bundle.
"""

from __future__ import annotations

import argparse
import encodings.idna  # noqa: F401  (connect encodes addresses with it: loaded while the files are readable)
import json
import os
import socket
import sys


def parse_target(text: str) -> tuple[str, int]:
    """'169.254.169.254:80' or '[fd00:ec2::254]:80' -> (address, port)."""
    address, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not address:
        raise ValueError(f"target {text!r}: allowed: ADDRESS:PORT, or [IPv6]:PORT")
    return address.strip("[]"), int(port)


def take_identity(uid: int, gid: int, groups: list[int]) -> None:
    """Become uid/gid with `groups`; nothing to do when this process already is that user (tests run so)."""
    same_groups = set(os.getgroups()) - {gid} == set(groups) - {gid}  # getgroups may list the primary group
    if (os.getuid(), os.geteuid(), os.getgid()) == (uid, uid, gid) and same_groups:
        return
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)  # last: after it, the process can no longer change its groups


def try_connect(address: str, port: int, timeout_s: float) -> tuple[bool, str | None]:
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True, None
    except OSError as e:  # refused (the block's REJECT), timed out, no route
        return False, f"{type(e).__name__}: {e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metadata_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--groups", default="", help="supplementary gids, comma-separated")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="connect timeout per target")
    parser.add_argument("targets", nargs="+", metavar="ADDRESS:PORT")
    args = parser.parse_args(argv)
    try:
        targets = [parse_target(t) for t in args.targets]
        groups = [int(g) for g in args.groups.split(",") if g]
    except ValueError as e:
        print(f"metadata_probe: {e}", file=sys.stderr)
        return 2
    try:
        take_identity(args.uid, args.gid, groups)
    except OSError as e:
        print(f"metadata_probe: cannot become uid {args.uid} gid {args.gid}: {e}", file=sys.stderr)
        return 2
    results = []
    for (address, port), text in zip(targets, args.targets):
        connected, error = try_connect(address, port, args.timeout_s)
        results.append({"target": text, "connected": connected, "error": error})
    print(json.dumps({"uid": os.geteuid(), "targets": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

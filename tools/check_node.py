"""Tell the user plainly whether their Node.js can run the pinned AWS CDK CLI (`make setup` runs this first).

Two sources decide it:
- the pinned CLI's own floor: package-lock.json, `node_modules/aws-cdk` `engines.node` (">= 18.0.0" for
  aws-cdk 2.1148.1). Below it the CLI does not run: an error, and make stops.
- AWS's support policy (AWS CDK Developer Guide, "Supported Node.js versions for the AWS CDK", checked
  2026-11): CDK supports Node.js LTS releases until 6 months after their community end-of-life. A Node the CLI
  still runs on but CDK no longer supports (Node 20 since 2026-10-30), or an odd, non-LTS release, gets one
  warning line and make goes on.

Usage: python3 tools/check_node.py [--version vX.Y.Z] [--today YYYY-MM-DD]  (both for tests; default: `node
--version` and today's date). Exit 0: supported or a warning; 1: no Node.js or one the CLI cannot run on.
Standard library only, so it runs before the virtual environment exists.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Node.js major -> the date AWS CDK support ends (community end-of-life + 6 months).
CDK_SUPPORT_ENDS = {
    20: dt.date(2026, 10, 30),
    22: dt.date(2027, 10, 30),
    24: dt.date(2028, 10, 30),
}
INSTALL_HINT = "install Node.js 22 or 24 (an LTS release AWS CDK supports), e.g. from nodejs.org or your OS's packages"


def cli_minimum_major(lock_file: Path = REPO_ROOT / "package-lock.json") -> int:
    """The lowest Node.js major the pinned aws-cdk CLI declares it runs on (its engines field)."""
    engines = json.loads(lock_file.read_text())["packages"]["node_modules/aws-cdk"]["engines"]["node"]
    match = re.fullmatch(r">=\s*(\d+)(\.\d+)*", engines.strip())
    if not match:
        raise ValueError(f"unexpected engines.node {engines!r} for aws-cdk in {lock_file}")
    return int(match.group(1))


def supported_now(today: dt.date) -> list[str]:
    return [f"{major}.x (until {end.isoformat()})" for major, end in sorted(CDK_SUPPORT_ENDS.items()) if end >= today]


def judge(version: str | None, today: dt.date, minimum_major: int) -> tuple[int, str]:
    """(exit code, message) for a `node --version` output; the message is empty when all is well."""
    supported = ", ".join(supported_now(today))
    if version is None:
        return 1, f"error: Node.js not found: the AWS CDK CLI needs it; {INSTALL_HINT}. Supported: {supported}."
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)\S*", version.strip())
    if not match:
        return 1, f"error: cannot read the Node.js version from {version.strip()!r}; {INSTALL_HINT}."
    major = int(match.group(1))
    found = version.strip()
    if major < minimum_major:
        return 1, (
            f"error: Node.js {found} is too old for the pinned AWS CDK CLI (it needs >= {minimum_major}); "
            f"{INSTALL_HINT}. Supported: {supported}."
        )
    end = CDK_SUPPORT_ENDS.get(major)
    if end is None and not major % 2 and major < min(CDK_SUPPORT_ENDS):
        # an LTS release older than the table (18): its CDK support ended before the oldest entry's
        return 0, (
            f"warning: Node.js {found} is no longer supported by AWS CDK (supported: {supported}). make goes on "
            f"(the pinned CLI still runs on Node >= {minimum_major}), but {INSTALL_HINT}."
        )
    if end is None:
        why = "an odd-numbered, non-LTS release" if major % 2 else "not yet in AWS CDK's support table"
        return 0, (
            f"warning: Node.js {found} is {why}: AWS CDK supports {supported}. make goes on; if synthesis "
            f"misbehaves, {INSTALL_HINT}."
        )
    if today > end:
        return 0, (
            f"warning: Node.js {found} is no longer supported by AWS CDK (support ended {end.isoformat()}; "
            f"supported: {supported}). make goes on (the pinned CLI still runs on Node >= {minimum_major}), "
            f"but {INSTALL_HINT}."
        )
    return 0, ""


def node_version() -> str | None:
    node = shutil.which("node")
    if node is None:
        return None
    result = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", help="a `node --version` output to judge instead of the installed node")
    parser.add_argument("--today", type=dt.date.fromisoformat, default=None, help="the date to judge against")
    args = parser.parse_args(argv)
    version = args.version if args.version is not None else node_version()
    code, message = judge(version, args.today or dt.date.today(), cli_minimum_major())
    if message:
        print(f"check_node: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

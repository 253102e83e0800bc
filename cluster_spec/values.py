"""Parsers for setting values: each takes the key (for the message) and the raw value, typed from cdk.json
or a string from `-c key=value`, and returns the typed value or raises SettingsError with one line naming the
key, the value and what is allowed."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

BUCKET = re.compile(r"^(?!xn--)(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
MOUNT_POINT = re.compile(r"^/[A-Za-z0-9_./-]*[A-Za-z0-9_]$")
# An IAM role ARN as aws:PrincipalArn reports a role's sessions: partition, account, optional path, name (IAM
# names: letters, digits and + = , . @ _ -). The name may hold * for ArnLike (an SSO permission set's role
# carries a generated suffix), but starts with a literal character: "role/*" would be every role.
ROLE_ARN = re.compile(r"^arn:aws(-cn|-us-gov)?:iam::\d{12}:role/([\w+=,.@-]+/)*[\w+=,.@-][\w+=,.@*-]*$", re.ASCII)
# Tag keys and values: the characters every AWS service accepts (letters, digits and spaces representable in
# UTF-8, and _ . : / = + - @), keys 1-128 and values 0-256 characters (Tagging AWS Resources, "Tag naming limits
# and requirements"). EC2 alone allows more, but the stack's tags land on S3, FSx, Logs, SNS and KMS too.
TAG_CHARACTERS = r"[\w .:/=+@-]"
TAG_KEY = re.compile(TAG_CHARACTERS + r"{1,128}")
TAG_VALUE = re.compile(TAG_CHARACTERS + r"{0,256}")
# A resource holds at most 50 user tags; every node also carries Name, cluster:bootstrap and
# cluster:bootstrap-reason, so the stack's own tags may take 47.
MAX_TAGS = 47
# "aws:" keys are AWS's (any case); "cluster:" keys are the nodes' readiness contract (a propagated
# cluster:bootstrap=ready would make a booting node look ready).
RESERVED_TAG_PREFIXES = ("aws:", "cluster:")


class SettingsError(ValueError):
    """An invalid setting. The message is one line naming the key, the value and what is allowed."""


def invalid(key: str, value: Any, allowed: str) -> SettingsError:
    return SettingsError(f"{key}={value!r}: {allowed}")


def string(key: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        if optional:
            return None
        raise invalid(key, value, "a value is required")
    if not isinstance(value, str):
        raise invalid(key, value, "must be a string")
    return value.strip()


def integer(key: str, value: Any, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool):
        raise invalid(key, value, "must be an integer")
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        value = int(value)
    if not isinstance(value, int):
        raise invalid(key, value, "must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise invalid(key, value, f"must be an integer >= {minimum}{upper}")
    return value


def boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise invalid(key, value, "allowed: true, false")


def choice(key: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    for option in allowed:
        if value == option or (isinstance(value, str) and value.strip() == str(option)):
            return option
    raise invalid(key, value, "allowed: " + ", ".join(str(a) for a in allowed))


def timestamp(key: str, value: Any) -> dt.datetime | None:
    text = string(key, value, optional=True)
    if text is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(key, value, "must be an ISO 8601 time, e.g. 2026-12-01T11:30:00Z") from None
    if parsed.tzinfo is None:
        raise invalid(key, value, "must carry a time zone, e.g. 2026-12-01T11:30:00Z")
    return parsed.astimezone(dt.UTC)


def mount_point(key: str, value: Any) -> str:
    text = string(key, value)
    if not MOUNT_POINT.fullmatch(text) or "/../" in text + "/" or text in ("/", "/boot", "/etc", "/usr", "/var"):
        raise invalid(
            key, value, "must be an absolute directory path such as /scratch, not a system directory"
        )
    return text


def bucket(key: str, value: Any) -> str | None:
    text = string(key, value, optional=True)
    if text is not None and (not BUCKET.fullmatch(text) or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", text)):
        raise invalid(key, value, "must be an S3 bucket name (3-63 lowercase letters, digits, dots, hyphens)")
    return text


def role_arn(key: str, value: Any) -> str | None:
    """An IAM role ARN, or None when empty."""
    text = string(key, value, optional=True)
    if text is not None and not ROLE_ARN.fullmatch(text):
        raise invalid(key, value, "must be an IAM role ARN such as arn:aws:iam::123456789012:role/checkpoint-admin "
                      "(a path is allowed; * only after the name's first character), or empty for none")
    return text


def tags(key: str, value: Any) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise invalid(key, value, "must be a JSON object or k=v,k2=v2") from None
        else:
            pairs = [p for p in text.split(",") if p.strip()]
            if not all("=" in p for p in pairs):
                raise invalid(key, value, "must be a JSON object or k=v,k2=v2")
            value = dict(p.split("=", 1) for p in pairs)
    if not isinstance(value, dict):
        raise invalid(key, value, "must be an object of tag keys to values")
    if len(value) > MAX_TAGS:
        raise invalid(key, f"{len(value)} tags", f"at most {MAX_TAGS} tags (a resource holds 50; nodes add 3)")
    tags = {}
    for raw_key, raw_value in value.items():
        tag_key = str(raw_key).strip()
        if not TAG_KEY.fullmatch(tag_key):
            raise invalid(
                f"{key} key",
                tag_key,
                "1-128 characters: letters, digits, spaces and _ . : / = + - @",
            )
        if tag_key.lower().startswith(RESERVED_TAG_PREFIXES):
            raise invalid(f"{key} key", tag_key, "must not start with aws: or cluster: (reserved)")
        if isinstance(raw_value, bool) or not isinstance(raw_value, str | int | float):
            raise invalid(f"{key}.{tag_key}", raw_value, "must be a string")
        tag_value = str(raw_value).strip()
        if not TAG_VALUE.fullmatch(tag_value):
            raise invalid(
                f"{key}.{tag_key}",
                tag_value,
                "0-256 characters: letters, digits, spaces and _ . : / = + - @",
            )
        tags[tag_key] = tag_value
    return tags


def usd(key: str, value: Any) -> float | None:
    """An amount in US dollars > 0; empty means "not set"."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    if isinstance(value, bool):
        raise invalid(key, value, "must be an amount in USD > 0, or empty for none")
    try:
        amount = float(value)
    except (TypeError, ValueError):
        raise invalid(key, value, "must be an amount in USD > 0, or empty for none") from None
    if not 0 < amount < float("inf"):
        raise invalid(key, value, "must be an amount in USD > 0, or empty for none")
    return amount


def int_or_raw(value: Any) -> Any:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def email(value: Any) -> str | None:
    text = string("alarmEmail", value, optional=True)
    if text is not None and not EMAIL.fullmatch(text):
        raise invalid("alarmEmail", value, "must be an email address")
    return text

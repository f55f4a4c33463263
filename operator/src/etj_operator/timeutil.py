"""RFC 3339 timestamps as Kubernetes writes them, always timezone-aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time(value: object) -> datetime | None:
    """Parse a metav1.Time/MicroTime string (or pass a datetime through); None for anything else."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)

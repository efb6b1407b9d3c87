"""Checks that may fail on one rank only, made collective: every rank raises the same
``ulysses.Error``, or none does, before any data moves (a rank raising alone would leave the
others waiting in the next collective)."""

import math
import operator

from ._ulysses import Error

INT64_MAX = 2**63 - 1


def attempt(check, *args):
    """``check(*args)`` on this rank, not collective: (its result, "") or (None, why it raised)."""
    try:
        return check(*args), ""
    except Error as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001  (a TypeError on one rank must stop every rank too)
        return None, f"{type(e).__name__}: {e}"


def agreed(comm, check, *args):
    """Collective over ``comm`` (a ``ulysses.Communicator``): ``check(*args)`` on this rank, then
    one small all-reduce; when it raised on any rank, every rank raises the same Error (the
    lowest failing rank's message, prefixed with that rank)."""
    result, error = attempt(check, *args)
    comm._impl.agree(error)
    return result


def agreed_all(comm, what, count, check, *args):
    """Collective, the one agreement of a call: ``check(*args)`` returns (result, description,
    ``count`` integers) on this rank; one small all-gather, and every rank raises the same Error
    when the check raised on any rank or the descriptions differ (naming ``what``). Returns
    (result, every rank's integers in rank order)."""
    out, error = attempt(check, *args)
    result, description, values = out if out is not None else (None, "", [0] * count)
    return result, comm._impl.agree_all(error, what, description, list(values))


def agree_identical(comm, what, *values):
    """Collective: every rank raises the same Error unless all ranks pass equal ``values``."""
    comm._impl.agree_identical(what, repr(values))


def integer(name, value, lo, hi):
    """``value`` as an int in [lo, hi], else Error naming ``name`` (no silent wrap-around in the
    library's 32- or 64-bit integers, no pybind11 conversion dump)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise Error(f"{name} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise Error(f"{name}: {v} is out of range [{lo}, {hi}]")
    return v


def real(name, value, lo=0.0, hi=math.inf):
    """``value`` as a finite float in [lo, hi], else Error naming ``name`` (NaN fails every
    comparison, so it would pass a plain range check)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise Error(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise Error(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or not lo <= v <= hi:
        raise Error(f"{name}: {value!r} is not a finite number in [{lo}, {hi}]")
    return v


def seconds_value(name, value):
    """A watchdog deadline: finite seconds >= 0 (0: none)."""
    return real(name, value, 0.0)

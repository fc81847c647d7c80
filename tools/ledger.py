"""A tiny double-entry ledger in Redis, so that double execution of a transfer is detectable.

Every application of a transfer is appended to ``<prefix>:log``. A transfer carries an
idempotency key: a second application under the same key is *not* applied again but
recorded in ``<prefix>:replays`` (the downstream honours the key, as Stripe's API does).
The executor's own idempotency record normally stops a second run long before that; the
replay list shows how often the last line of defence was needed.
"""

from __future__ import annotations

import json
import os
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import redis

from tools.builtin import BalanceArgs, TransferArgs
from tools.context import current_call
from tools.errors import InsufficientFundsError, ToolInputError

__all__ = ["DEMO_BALANCES", "Ledger", "ledger_from_env", "query_balance", "transfer"]

#: Seed balances in cents, per (account, currency).
DEMO_BALANCES: dict[str, dict[str, int]] = {
    "alice": {"CNY": 1_000_000, "USD": 200_000, "EUR": 100_000},
    "bob": {"CNY": 500_000, "USD": 100_000, "EUR": 50_000},
    "carol": {"CNY": 300_000, "USD": 50_000, "EUR": 20_000},
    "张三": {"CNY": 800_000, "USD": 10_000, "EUR": 0},
    "李四": {"CNY": 200_000, "USD": 0, "EUR": 0},
    "王五": {"CNY": 100_000, "USD": 0, "EUR": 0},
}

_TRANSFER = """
local balances, applied, log, replays = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local src, dst, cents, key, entry = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local previous = redis.call('HGET', applied, key)
if previous then
  redis.call('RPUSH', replays, key)
  return {'replay', previous}
end
local have = redis.call('HGET', balances, src)
if not have then return {'unknown_account', src} end
if tonumber(have) < cents then return {'insufficient', have} end
redis.call('HINCRBY', balances, src, -cents)
redis.call('HINCRBY', balances, dst, cents)
redis.call('HSET', applied, key, entry)
redis.call('RPUSH', log, entry)
return {'applied', entry}
"""


def to_cents(amount: Decimal | float | str) -> int:
    """Exact cents of a decimal amount (half-up)."""
    return int((Decimal(str(amount)) * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))


class Ledger:
    """Balances in cents per ``account|currency``, with an application log."""

    def __init__(self, client: redis.Redis, *, prefix: str = "toolrail:ledger") -> None:
        self._redis = client
        self.prefix = prefix
        self._transfer = client.register_script(_TRANSFER)

    def _keys(self) -> list[str]:
        p = self.prefix
        return [f"{p}:balances", f"{p}:applied", f"{p}:log", f"{p}:replays"]

    def seed(self, balances: dict[str, dict[str, int]] | None = None) -> None:
        """Create the demo accounts where missing (never overwrites a balance)."""
        key = f"{self.prefix}:balances"
        for account, per_currency in (balances or DEMO_BALANCES).items():
            for currency, cents in per_currency.items():
                self._redis.hsetnx(key, f"{account}|{currency}", cents)

    def balance(self, account: str) -> dict[str, int]:
        """``{currency: cents}`` of an account (empty if unknown)."""
        raw = self._redis.hgetall(f"{self.prefix}:balances")
        out: dict[str, int] = {}
        for field, value in raw.items():
            name, _, currency = field.decode().rpartition("|")
            if name == account:
                out[currency] = int(value)
        return out

    def transfer(self, *, from_account: str, to: str, cents: int, currency: str, idempotency_key: str) -> dict[str, Any]:
        """Move ``cents`` atomically; a repeated key returns the first result without applying."""
        if cents <= 0:
            raise ToolInputError("amount must be positive", cents=cents)
        if from_account == to:
            raise ToolInputError("from_account and to are the same account", account=to)
        entry = json.dumps({"key": idempotency_key, "from": from_account, "to": to, "cents": cents, "currency": currency},
                           ensure_ascii=False, sort_keys=True)
        status, payload = self._transfer(keys=self._keys(), args=[f"{from_account}|{currency}", f"{to}|{currency}", cents,
                                                                   idempotency_key, entry])
        status = status.decode()
        if status == "unknown_account":
            raise ToolInputError(f"unknown account {from_account!r} in {currency}", account=from_account, currency=currency)
        if status == "insufficient":
            raise InsufficientFundsError(f"{from_account} has {int(payload) / 100:.2f} {currency}, needs {cents / 100:.2f}",
                                         account=from_account, available_cents=int(payload), needed_cents=cents)
        return {"status": "replayed" if status == "replay" else "applied", **json.loads(payload)}

    def applications(self) -> list[dict[str, Any]]:
        """Every applied transfer, in order."""
        return [json.loads(item) for item in self._redis.lrange(f"{self.prefix}:log", 0, -1)]

    def replays(self) -> list[str]:
        return [item.decode() for item in self._redis.lrange(f"{self.prefix}:replays", 0, -1)]

    def total(self, currency: str) -> int:
        """Sum of every balance in ``currency`` (conserved by transfers)."""
        raw = self._redis.hgetall(f"{self.prefix}:balances")
        return sum(int(v) for k, v in raw.items() if k.decode().endswith(f"|{currency}"))


def ledger_from_env() -> Ledger:
    """The ledger a tool process is allowed to reach (``TOOLRAIL_LEDGER_URL``)."""
    url = os.environ.get("TOOLRAIL_LEDGER_URL")
    if not url:
        raise ToolInputError("this tool needs TOOLRAIL_LEDGER_URL (the ledger's Redis)")
    ledger = Ledger(redis.Redis.from_url(url, socket_timeout=5), prefix=os.environ.get("TOOLRAIL_LEDGER_PREFIX", "toolrail:ledger"))
    ledger.seed()
    return ledger


def query_balance(args: BalanceArgs) -> dict[str, Any]:
    """The ``query_balance`` tool: balances of an account per currency, from the ledger."""
    balances = ledger_from_env().balance(args.account)
    if not balances:
        return {"account": args.account, "found": False, "balances": {}}
    return {"account": args.account, "found": True,
            "balances": {currency: f"{Decimal(cents) / 100:.2f}" for currency, cents in sorted(balances.items())}}


def transfer(args: TransferArgs) -> dict[str, Any]:
    """The ``transfer`` tool: move money between ledger accounts, applied once per idempotency key."""
    call = current_call()
    return ledger_from_env().transfer(from_account=args.from_account, to=args.to, cents=to_cents(args.amount),
                                      currency=args.currency, idempotency_key=call.idempotency_key)

"""Built-in tools: deterministic and offline.

Each tool is a parameter model plus a function taking that model. The functions run
inside the sandbox child process, never in the Celery worker. The two ledger tools'
functions (``query_balance``, ``transfer``) live in :mod:`tools.ledger` beside the Redis
client they need: a fork server preloads the modules of its enabled tools, and this one
stays free of redis-py (10 MB more in the image every call's fork copies).
"""

from __future__ import annotations

import hashlib
import os
import time
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


__all__ = [
    "BalanceArgs",
    "StressArgs",
    "TransferArgs",
    "WeatherArgs",
    "get_weather",
    "stress",
]

CITY_ALIASES = {
    "沪": "Shanghai", "上海": "Shanghai", "上海市": "Shanghai", "申城": "Shanghai", "魔都": "Shanghai",
    "京": "Beijing", "北京": "Beijing", "北京市": "Beijing", "帝都": "Beijing", "Peking": "Beijing",
    "深圳": "Shenzhen", "鹏城": "Shenzhen", "广州": "Guangzhou", "羊城": "Guangzhou", "穗": "Guangzhou",
    "杭州": "Hangzhou", "成都": "Chengdu", "蓉城": "Chengdu", "南京": "Nanjing", "武汉": "Wuhan",
    "西安": "Xi'an", "天津": "Tianjin", "重庆": "Chongqing", "香港": "Hong Kong", "东京": "Tokyo",
    "纽约": "New York", "NYC": "New York", "伦敦": "London", "巴黎": "Paris", "柏林": "Berlin",
}
DATE_ALIASES = {"今天": "today", "今日": "today", "明天": "tomorrow", "明日": "tomorrow"}
UNIT_ALIASES = {"摄氏": "celsius", "摄氏度": "celsius", "℃": "celsius", "°C": "celsius", "C": "celsius",
                "华氏": "fahrenheit", "华氏度": "fahrenheit", "℉": "fahrenheit", "°F": "fahrenheit", "F": "fahrenheit"}
CURRENCY_ALIASES = {"元": "CNY", "人民币": "CNY", "块": "CNY", "RMB": "CNY", "rmb": "CNY", "¥": "CNY",
                    "美元": "USD", "美金": "USD", "刀": "USD", "$": "USD", "dollars": "USD", "dollar": "USD",
                    "欧元": "EUR", "€": "EUR", "euros": "EUR", "euro": "EUR"}


class WeatherArgs(BaseModel):
    """Get the weather forecast for a city today or tomorrow."""

    model_config = ConfigDict(extra="forbid")

    city: str = Field(min_length=1, max_length=64, description="City name",
                      json_schema_extra={"x-aliases": CITY_ALIASES, "x-grounded": True})
    date: Literal["today", "tomorrow"] = Field(description="Which day",
                                               json_schema_extra={"x-aliases": DATE_ALIASES})
    unit: Literal["celsius", "fahrenheit"] = Field(default="celsius", description="Temperature unit",
                                                   json_schema_extra={"x-aliases": UNIT_ALIASES})


class BalanceArgs(BaseModel):
    """Query the balance of a bank account."""

    model_config = ConfigDict(extra="forbid")

    account: str = Field(min_length=1, max_length=64, description="Account holder", json_schema_extra={"x-grounded": True})


class Currency(str, Enum):
    CNY = "CNY"
    USD = "USD"
    EUR = "EUR"


class TransferArgs(BaseModel):
    """Transfer money from one account to another."""

    model_config = ConfigDict(extra="forbid")

    from_account: str = Field(min_length=1, max_length=64, description="Payer account", json_schema_extra={"x-grounded": True})
    to: str = Field(min_length=1, max_length=64, description="Payee account", json_schema_extra={"x-grounded": True})
    amount: float = Field(gt=0, le=1_000_000, description="Amount, up to two decimals",
                          json_schema_extra={"x-grounded": True, "x-unit": {"currency_field": "currency"}})
    currency: Literal["CNY", "USD", "EUR"] = Field(description="ISO currency code",
                                                   json_schema_extra={"x-aliases": CURRENCY_ALIASES})


class StressArgs(BaseModel):
    """Exercise the sandbox limits: sleep, spin the CPU, allocate memory, crash, or print."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["sleep", "spin", "allocate", "crash", "ok"]
    amount: float = Field(default=0, ge=0, le=100_000, description="seconds for sleep/spin, megabytes for allocate")


def _stable_int(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:4], "big")


def get_weather(args: WeatherArgs) -> dict[str, Any]:
    """A deterministic forecast: the same city and date always give the same weather."""
    seed = _stable_int(args.city.lower(), args.date)
    celsius = -5 + seed % 36
    conditions = ["sunny", "cloudy", "overcast", "light rain", "showers", "snow", "windy", "fog"]
    temperature = celsius if args.unit == "celsius" else round(celsius * 9 / 5 + 32, 1)
    return {"city": args.city, "date": args.date, "unit": args.unit, "temperature": temperature,
            "condition": conditions[(seed >> 8) % len(conditions)], "humidity": 30 + (seed >> 16) % 60}


def stress(args: StressArgs) -> dict[str, Any]:
    """Deliberately misbehave, to prove the sandbox's limits."""
    if args.mode == "sleep":
        time.sleep(args.amount)
    elif args.mode == "spin":
        deadline = time.process_time() + args.amount
        while time.process_time() < deadline:
            pass
    elif args.mode == "allocate":
        blob = bytearray(int(args.amount * 1024 * 1024))
        blob[::4096] = b"x" * len(blob[::4096])
    elif args.mode == "crash":
        os.abort()
    return {"mode": args.mode, "amount": args.amount, "pid": os.getpid()}

"""Tool sets for the decision-quality benchmark.

Three sets, each a list of ``tools.spec.ToolSpec``:

- ``builtin``: ``get_weather``, ``query_balance``, ``transfer`` from ``tools.registry`` (the
  platform's own tools, so the benchmark measures exactly what the platform serves).
- ``calendar``: room booking, cancellation and meetings: ISO dates, HH:MM times, counts with
  bounds, a defaulted duration, room and weekday enums with Chinese cue words.
- ``orders``: order status, refunds (decimal amounts, a reason enum), quantity changes and
  recipient changes (names, phone numbers), with order ids under a pattern.

``calendar`` and ``orders`` exist only for evaluation, so that nothing in the decider can be
tuned to the built-in tools without the harness noticing.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tools.spec import ToolSpec

__all__ = ["BUILTIN_TOOL_NAMES", "TOOLSETS", "builtin_specs", "calendar_specs", "load_toolset", "orders_specs",
           "spec_map"]

#: The built-in tools the benchmark asks about (the registry also holds test-only tools such as ``stress``).
BUILTIN_TOOL_NAMES = ("get_weather", "query_balance", "transfer")


def builtin_specs() -> list[ToolSpec]:
    """``get_weather``, ``query_balance``, ``transfer``: the platform's own specs, from the registry."""
    from tools.registry import default_registry  # noqa: PLC0415

    return default_registry().specs(list(BUILTIN_TOOL_NAMES))


# --------------------------------------------------------------------------------------------
# calendar (evaluation only)
# --------------------------------------------------------------------------------------------

_ISO_DATE = r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"
_HH_MM = r"^([01]\d|2[0-3]):[0-5]\d$"

_ROOM_CUES = {
    "aurora": ["aurora", "Aurora", "极光", "极光厅"],
    "cedar": ["cedar", "Cedar", "雪松", "雪松厅"],
    "harbor": ["harbor", "Harbor", "港湾", "港湾厅"],
}
_WEEKDAY_CUES = {
    "monday": ["monday", "Monday", "Mon", "周一", "星期一", "礼拜一"],
    "tuesday": ["tuesday", "Tuesday", "Tue", "周二", "星期二", "礼拜二"],
    "wednesday": ["wednesday", "Wednesday", "Wed", "周三", "星期三", "礼拜三"],
    "thursday": ["thursday", "Thursday", "Thu", "周四", "星期四", "礼拜四"],
    "friday": ["friday", "Friday", "Fri", "周五", "星期五", "礼拜五"],
}


class BookRoomArgs(BaseModel):
    """Book a meeting room for a date, start time and number of attendees."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # words that say a request is about this tool (decider.grounding.tool_cues)
        "x-cues": ["预订", "预定", "订个", "订一个", "会议室", "reserve", "reservation"],
    })

    room: Literal["aurora", "cedar", "harbor"] = Field(description="Room name",
                                                       json_schema_extra={"x-enum-aliases": _ROOM_CUES})
    date: str = Field(pattern=_ISO_DATE, description="Date, YYYY-MM-DD", json_schema_extra={"x-grounded": True})
    start_time: str = Field(pattern=_HH_MM, description="Start time, HH:MM (24 h)", json_schema_extra={"x-grounded": True})
    attendees: int = Field(ge=1, le=20, description="Number of people")
    duration_minutes: int = Field(default=60, ge=15, le=240, description="Length of the booking in minutes")


class CancelBookingArgs(BaseModel):
    """Cancel a room booking by its id."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # words that say a request is about this tool (decider.grounding.tool_cues)
        "x-cues": ["取消", "退订", "cancel", "call off"],
    })

    booking_id: str = Field(pattern=r"^BK-\d{4}$", description="Booking id like BK-1234",
                            json_schema_extra={"x-grounded": True})


class ScheduleMeetingArgs(BaseModel):
    """Put a meeting with one person on a weekday at a time."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # words that say a request is about this tool (decider.grounding.tool_cues)
        "x-cues": ["开会", "会议", "约个", "约一下", "见面", "碰头", "meeting", "meet", "schedule", "catch up"],
    })

    title: str = Field(min_length=1, max_length=40, description="Meeting title", json_schema_extra={"x-grounded": True})
    with_person: str = Field(min_length=1, max_length=40, description="The other participant",
                             json_schema_extra={"x-grounded": True})
    day: Literal["monday", "tuesday", "wednesday", "thursday", "friday"] = Field(
        description="Weekday", json_schema_extra={"x-enum-aliases": _WEEKDAY_CUES})
    time: str = Field(pattern=_HH_MM, description="Start time, HH:MM (24 h)", json_schema_extra={"x-grounded": True})


def calendar_specs() -> list[ToolSpec]:
    """The calendar set: ``book_room``, ``cancel_booking``, ``schedule_meeting``."""
    return [
        ToolSpec.from_model("book_room", BookRoomArgs, side_effects=True),
        ToolSpec.from_model("cancel_booking", CancelBookingArgs, side_effects=True),
        ToolSpec.from_model("schedule_meeting", ScheduleMeetingArgs, side_effects=True),
    ]


# --------------------------------------------------------------------------------------------
# orders (evaluation only)
# --------------------------------------------------------------------------------------------

_ORDER_ID = r"^SO\d{6}$"
_REASON_CUES = {
    "damaged": ["damaged", "broken", "cracked", "损坏", "坏了", "破损", "摔坏"],
    "wrong_item": ["wrong item", "wrong", "发错", "错发"],
    "not_received": ["not received", "never arrived", "didn't arrive", "没收到", "未收到", "没到"],
    "changed_mind": ["changed my mind", "no longer need", "不想要", "不要了"],
}


class OrderStatusArgs(BaseModel):
    """Look up where an order is."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # words that say a request is about this tool (decider.grounding.tool_cues)
        "x-cues": ["状态", "到哪", "物流", "快递", "进度", "status", "where", "track", "shipped"],
    })

    order_id: str = Field(pattern=_ORDER_ID, description="Order id like SO123456", json_schema_extra={"x-grounded": True})


class RefundOrderArgs(BaseModel):
    """Refund part or all of an order."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # words that say a request is about this tool (decider.grounding.tool_cues)
        "x-cues": ["退款", "退钱", "退", "返还", "refund", "money back", "reimburse"],
    })

    order_id: str = Field(pattern=_ORDER_ID, description="Order id like SO123456", json_schema_extra={"x-grounded": True})
    amount: float = Field(gt=0, le=5000, description="Refund amount, up to two decimals")
    reason: Literal["damaged", "wrong_item", "not_received", "changed_mind"] = Field(
        description="Why the customer wants a refund", json_schema_extra={"x-enum-aliases": _REASON_CUES})


class ChangeQuantityArgs(BaseModel):
    """Change how many units an order contains."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # words that say a request is about this tool (decider.grounding.tool_cues)
        "x-cues": ["数量", "件数", "几件", "quantity", "units", "pieces", "copies"],
    })

    order_id: str = Field(pattern=_ORDER_ID, description="Order id like SO123456", json_schema_extra={"x-grounded": True})
    quantity: int = Field(ge=1, le=99, description="New number of units")


class UpdateRecipientArgs(BaseModel):
    """Change who receives an order and their phone number."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # words that say a request is about this tool (decider.grounding.tool_cues)
        "x-cues": ["收件人", "收货人", "电话", "手机号", "recipient", "receiver", "ship to", "phone"],
    })

    order_id: str = Field(pattern=_ORDER_ID, description="Order id like SO123456", json_schema_extra={"x-grounded": True})
    recipient: str = Field(min_length=1, max_length=30, description="Recipient's name", json_schema_extra={"x-grounded": True})
    phone: str = Field(pattern=r"^\+?\d{7,15}$", description="Recipient's phone number",
                       json_schema_extra={"x-grounded": True})


def orders_specs() -> list[ToolSpec]:
    """The orders set: ``get_order_status``, ``refund_order``, ``change_quantity``, ``update_recipient``."""
    return [
        ToolSpec.from_model("get_order_status", OrderStatusArgs),
        ToolSpec.from_model("refund_order", RefundOrderArgs, side_effects=True),
        ToolSpec.from_model("change_quantity", ChangeQuantityArgs, side_effects=True),
        ToolSpec.from_model("update_recipient", UpdateRecipientArgs, side_effects=True),
    ]


TOOLSETS: dict[str, Callable[[], list[ToolSpec]]] = {
    "builtin": builtin_specs,
    "calendar": calendar_specs,
    "orders": orders_specs,
}


@lru_cache(maxsize=None)
def _cached(name: str) -> tuple[ToolSpec, ...]:
    return tuple(TOOLSETS[name]())


def load_toolset(name: str) -> list[ToolSpec]:
    """The specs of tool set ``name`` (built once per process)."""
    if name not in TOOLSETS:
        raise KeyError(f"unknown tool set {name!r}; known: {sorted(TOOLSETS)}")
    return list(_cached(name))


def spec_map(name: str) -> dict[str, ToolSpec]:
    """``{tool name: spec}`` of tool set ``name``."""
    return {spec.name: spec for spec in load_toolset(name)}

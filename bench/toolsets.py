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

Five more sets make the ``unseen`` split (``bench/data/unseen_<set>.jsonl``): tool sets shaped
like what agent builders register, written after the decider was built and scored once at the
end, never tuned on. They carry only what a tool author would declare: JSON Schema shapes
(``format``, ``pattern``, bounds, enums), ``x-aliases`` on enums and ``x-grounded`` on values that
must come from the conversation; no cue words for any decider mechanism.

- ``email``: ``send_email`` (recipient arrays, a composed body), ``search_inbox``.
- ``agenda``: ``create_event``, ``list_events`` with RFC 3339 ``date-time`` fields and attendee arrays.
- ``search``: ``web_search`` (bounded result count), ``get_stock_quote`` (ticker pattern),
  ``convert_currency`` (ISO 4217 enum with aliases).
- ``devops``: ``restart_service`` (enums, a defaulted boolean), ``create_ticket``, ``get_logs`` (bounded integer).
- ``commerce``: ``place_order`` (an array of objects), ``cancel_order``, ``track_order``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from tools.spec import ToolSpec

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "TOOLSETS",
    "TUNED_TOOLSETS",
    "UNSEEN_TOOLSETS",
    "agenda_specs",
    "builtin_specs",
    "calendar_specs",
    "commerce_specs",
    "devops_specs",
    "email_specs",
    "load_toolset",
    "orders_specs",
    "search_specs",
    "spec_map",
]

#: The built-in tools the benchmark asks about (the registry also holds test-only tools such as ``stress``).
BUILTIN_TOOL_NAMES = ("get_weather", "query_balance", "transfer")


def builtin_specs() -> list[ToolSpec]:
    """``get_weather``, ``query_balance``, ``transfer``: the platform's own demo specs, whether or not
    ``TOOLRAIL_DEMO_TOOLS`` registers them in this process."""
    from tools import registry  # noqa: PLC0415

    return registry.builtin_specs(BUILTIN_TOOL_NAMES)


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
        # cue words the previous decider read (x-cues); kept as tool-author data, read by nothing now
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
        # cue words the previous decider read (x-cues); kept as tool-author data, read by nothing now
        "x-cues": ["取消", "退订", "cancel", "call off"],
    })

    booking_id: str = Field(pattern=r"^BK-\d{4}$", description="Booking id like BK-1234",
                            json_schema_extra={"x-grounded": True})


class ScheduleMeetingArgs(BaseModel):
    """Put a meeting with one person on a weekday at a time."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # cue words the previous decider read (x-cues); kept as tool-author data, read by nothing now
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
        # cue words the previous decider read (x-cues); kept as tool-author data, read by nothing now
        "x-cues": ["状态", "到哪", "物流", "快递", "进度", "status", "where", "track", "shipped"],
    })

    order_id: str = Field(pattern=_ORDER_ID, description="Order id like SO123456", json_schema_extra={"x-grounded": True})


class RefundOrderArgs(BaseModel):
    """Refund part or all of an order."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # cue words the previous decider read (x-cues); kept as tool-author data, read by nothing now
        "x-cues": ["退款", "退钱", "退", "返还", "refund", "money back", "reimburse"],
    })

    order_id: str = Field(pattern=_ORDER_ID, description="Order id like SO123456", json_schema_extra={"x-grounded": True})
    amount: float = Field(gt=0, le=5000, description="Refund amount, up to two decimals")
    reason: Literal["damaged", "wrong_item", "not_received", "changed_mind"] = Field(
        description="Why the customer wants a refund", json_schema_extra={"x-enum-aliases": _REASON_CUES})


class ChangeQuantityArgs(BaseModel):
    """Change how many units an order contains."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # cue words the previous decider read (x-cues); kept as tool-author data, read by nothing now
        "x-cues": ["数量", "件数", "几件", "quantity", "units", "pieces", "copies"],
    })

    order_id: str = Field(pattern=_ORDER_ID, description="Order id like SO123456", json_schema_extra={"x-grounded": True})
    quantity: int = Field(ge=1, le=99, description="New number of units")


class UpdateRecipientArgs(BaseModel):
    """Change who receives an order and their phone number."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        # cue words the previous decider read (x-cues); kept as tool-author data, read by nothing now
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


# --------------------------------------------------------------------------------------------
# unseen split: agent-style tool sets (evaluation only, never tuned on)
# --------------------------------------------------------------------------------------------

_Email = Annotated[str, Field(json_schema_extra={"format": "email"})]
_DATE_TIME = {"format": "date-time"}


class SendEmailArgs(BaseModel):
    """Send an email from the user's mailbox."""

    model_config = ConfigDict(extra="forbid")

    to: list[_Email] = Field(min_length=1, max_length=10, description="Recipient email addresses",
                             json_schema_extra={"x-grounded": True})
    cc: list[_Email] = Field(default_factory=list, max_length=10, description="Addresses to copy",
                             json_schema_extra={"x-grounded": True})
    subject: str = Field(min_length=1, max_length=150, description="Subject line")
    body: str = Field(min_length=1, max_length=4000, description="The message text, written out in full")


class SearchInboxArgs(BaseModel):
    """Search the user's inbox and return matching messages."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=200, description="Search terms")
    sender: _Email | None = Field(default=None, description="Only messages from this address")
    unread_only: bool = Field(default=False, description="Only unread messages")
    max_results: int = Field(default=10, ge=1, le=50, description="How many messages to return")


def email_specs() -> list[ToolSpec]:
    """The email set: ``send_email``, ``search_inbox``."""
    return [
        ToolSpec.from_model("send_email", SendEmailArgs, side_effects=True),
        ToolSpec.from_model("search_inbox", SearchInboxArgs),
    ]


class CreateEventArgs(BaseModel):
    """Create an event in the user's calendar and invite attendees."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=120, description="Event title")
    start: str = Field(description="Start, RFC 3339 date-time with offset, e.g. 2030-01-31T09:30:00Z (Z when no zone is given)",
                       json_schema_extra={**_DATE_TIME, "x-grounded": True})
    duration_minutes: int = Field(default=30, ge=5, le=480, description="Length in minutes")
    attendees: list[_Email] = Field(default_factory=list, max_length=20, description="Email addresses to invite",
                                    json_schema_extra={"x-grounded": True})
    location: str | None = Field(default=None, max_length=120, description="Room, address or video link")


class ListEventsArgs(BaseModel):
    """List the events in the user's calendar between two instants."""

    model_config = ConfigDict(extra="forbid")

    start: str = Field(description="Range start, RFC 3339 date-time with offset (Z when no zone is given)",
                       json_schema_extra=_DATE_TIME)
    end: str = Field(description="Range end, RFC 3339 date-time with offset (Z when no zone is given)",
                     json_schema_extra=_DATE_TIME)
    attendee: _Email | None = Field(default=None, description="Only events this address attends")


def agenda_specs() -> list[ToolSpec]:
    """The agenda set: ``create_event``, ``list_events``."""
    return [
        ToolSpec.from_model("create_event", CreateEventArgs, side_effects=True),
        ToolSpec.from_model("list_events", ListEventsArgs),
    ]


_CURRENCIES = Literal["USD", "EUR", "GBP", "JPY", "CNY", "CAD", "CHF"]
_CURRENCY_ALIASES = {
    "dollar": "USD", "dollars": "USD", "US dollars": "USD", "美元": "USD", "美金": "USD",
    "euro": "EUR", "euros": "EUR", "欧元": "EUR",
    "pound": "GBP", "pounds": "GBP", "sterling": "GBP", "英镑": "GBP",
    "yen": "JPY", "日元": "JPY",
    "yuan": "CNY", "renminbi": "CNY", "RMB": "CNY", "人民币": "CNY",
    "Canadian dollars": "CAD", "加元": "CAD",
    "Swiss francs": "CHF", "瑞士法郎": "CHF",
}


class WebSearchArgs(BaseModel):
    """Search the web and return the top results."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=200, description="Search query")
    max_results: int = Field(default=5, ge=1, le=10, description="Number of results")


class StockQuoteArgs(BaseModel):
    """Get the latest price of a listed stock."""

    model_config = ConfigDict(extra="forbid")

    ticker: str = Field(pattern=r"^[A-Z]{1,5}$", description="Exchange ticker symbol, e.g. AAPL")


class ConvertCurrencyArgs(BaseModel):
    """Convert an amount between currencies at today's rate."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    amount: float = Field(gt=0, le=1_000_000_000, description="Amount to convert", json_schema_extra={"x-grounded": True})
    from_currency: _CURRENCIES = Field(alias="from", description="ISO 4217 code of the amount's currency",
                                       json_schema_extra={"x-aliases": _CURRENCY_ALIASES})
    to_currency: _CURRENCIES = Field(alias="to", description="ISO 4217 code to convert into",
                                     json_schema_extra={"x-aliases": _CURRENCY_ALIASES})


def search_specs() -> list[ToolSpec]:
    """The search set: ``web_search``, ``get_stock_quote``, ``convert_currency`` (all read-only)."""
    return [
        ToolSpec.from_model("web_search", WebSearchArgs),
        ToolSpec.from_model("get_stock_quote", StockQuoteArgs),
        ToolSpec.from_model("convert_currency", ConvertCurrencyArgs),
    ]


_SERVICES = Literal["checkout-api", "payments-worker", "search-indexer", "auth-gateway", "notification-service"]
_ENVIRONMENT_ALIASES = {
    "prod": "production", "live": "production", "生产": "production", "生产环境": "production", "线上": "production",
    "stage": "staging", "预发": "staging", "预发布": "staging", "预发环境": "staging",
    "dev": "development", "开发": "development", "开发环境": "development",
}
_PRIORITY_ALIASES = {
    "P0": "urgent", "P1": "high", "P2": "medium", "P3": "low",
    "紧急": "urgent", "高": "high", "中": "medium", "低": "low",
}


class RestartServiceArgs(BaseModel):
    """Restart a service in one environment."""

    model_config = ConfigDict(extra="forbid")

    service_name: _SERVICES = Field(description="Service to restart")
    environment: Literal["production", "staging", "development"] = Field(
        description="Where to restart it", json_schema_extra={"x-aliases": _ENVIRONMENT_ALIASES})
    force: bool = Field(default=False, description="Kill without draining connections")


class CreateTicketArgs(BaseModel):
    """Open a ticket in the engineering issue tracker."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=120, description="One-line summary")
    priority: Literal["low", "medium", "high", "urgent"] = Field(
        description="Priority", json_schema_extra={"x-aliases": _PRIORITY_ALIASES})
    description: str = Field(min_length=1, max_length=4000, description="What happened, in full sentences")


class GetLogsArgs(BaseModel):
    """Fetch the most recent log lines of a service."""

    model_config = ConfigDict(extra="forbid")

    service: _SERVICES = Field(description="Service whose logs to read")
    environment: Literal["production", "staging", "development"] = Field(
        default="production", description="Which environment", json_schema_extra={"x-aliases": _ENVIRONMENT_ALIASES})
    lines: int = Field(default=100, ge=10, le=1000, description="How many recent lines")


def devops_specs() -> list[ToolSpec]:
    """The devops set: ``restart_service``, ``create_ticket``, ``get_logs``."""
    return [
        ToolSpec.from_model("restart_service", RestartServiceArgs, side_effects=True),
        ToolSpec.from_model("create_ticket", CreateTicketArgs, side_effects=True),
        ToolSpec.from_model("get_logs", GetLogsArgs),
    ]


_SHOP_ORDER_ID = r"^ORD-\d{6}$"


class OrderLine(BaseModel):
    """One product line of an order."""

    model_config = ConfigDict(extra="forbid")

    sku: str = Field(pattern=r"^[A-Z]{2}-\d{4}$", description="Product SKU, e.g. KT-2041", json_schema_extra={"x-grounded": True})
    quantity: int = Field(default=1, ge=1, le=20, description="Units of this product")


class PlaceOrderArgs(BaseModel):
    """Place an order for one or more products, shipped to one address."""

    model_config = ConfigDict(extra="forbid")

    items: list[OrderLine] = Field(min_length=1, max_length=10, description="Products and quantities")
    shipping_address: str = Field(min_length=5, max_length=200, description="Full delivery address",
                                  json_schema_extra={"x-grounded": True})


class CancelOrderArgs(BaseModel):
    """Cancel an order that has not shipped yet."""

    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(pattern=_SHOP_ORDER_ID, description="Order id, e.g. ORD-000123", json_schema_extra={"x-grounded": True})


class TrackOrderArgs(BaseModel):
    """Where an order is and when it should arrive."""

    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(pattern=_SHOP_ORDER_ID, description="Order id, e.g. ORD-000123", json_schema_extra={"x-grounded": True})


def commerce_specs() -> list[ToolSpec]:
    """The commerce set: ``place_order``, ``cancel_order``, ``track_order``."""
    return [
        ToolSpec.from_model("place_order", PlaceOrderArgs, side_effects=True),
        ToolSpec.from_model("cancel_order", CancelOrderArgs, side_effects=True),
        ToolSpec.from_model("track_order", TrackOrderArgs),
    ]


#: The sets the decider was developed against (dev/holdout rows).
TUNED_TOOLSETS = ("builtin", "calendar", "orders")
#: The sets of the ``unseen`` split.
UNSEEN_TOOLSETS = ("email", "agenda", "search", "devops", "commerce")

TOOLSETS: dict[str, Callable[[], list[ToolSpec]]] = {
    "builtin": builtin_specs,
    "calendar": calendar_specs,
    "orders": orders_specs,
    "email": email_specs,
    "agenda": agenda_specs,
    "search": search_specs,
    "devops": devops_specs,
    "commerce": commerce_specs,
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

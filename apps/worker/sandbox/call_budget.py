"""Each provider call's worst case, reserved before the gateway forwards it and settled to what it used.

A call's worst case is its input bound (provider_calls.input_bound) plus its output ceiling, in tokens, and in
dollars at the model's dearest input rate (plain, cache read or cache write) and its output rate. Before the
call leaves the host the gateway reserves it against what is left of

    the job's token budget     PI_MAX_TOKENS (a settings row may lower it)
    the job's dollar cap       PI_MAX_COST_USD or the trigger's run.maxCostUsd; the job already holds the whole
                               cap in every dollar window (budget.reserve_dollars), so a job that never passes
                               its cap never passes a window either
    the day's tokens           PI_DAILY_TOKEN_CAP, fleet-wide: reserved in the day's Redis counter by one script

and lowers the call's output ceiling to what is left (setting one where the request has none). Calls in flight
each hold their own reservation, so forty at once pass no more than one could; a call that does not fit while
others are in flight waits for them to settle, and one that does not fit alone is refused and stops the job.
When the answer ends the reservation is settled to the metered usage: the job's counts take what the provider
reported, the day's counter gives back the difference.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal

from apps.worker.gates import budget, money
from apps.worker.sandbox.prices import MILLION

# Below this many output tokens a call is not worth forwarding: what is left is refused instead.
MIN_OUTPUT_TOKENS = 256


class BudgetRefused(Exception):
    """No room for the call's worst case: its reason is the cap that has none (the job is then stopped)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Rates:
    """Dollars per token, the worst an input token and an output token can cost for one model."""

    input: Decimal
    output: Decimal

    @classmethod
    def of(cls, price: dict[str, Decimal] | None) -> Rates | None:
        if price is None:
            return None
        dearest_input = max(price["input"], price["cacheRead"], price["cacheWrite"])
        return cls(dearest_input / MILLION, price["output"] / MILLION)

    def cost(self, input_tokens: int, output_tokens: int) -> Decimal:
        return self.input * input_tokens + self.output * output_tokens


@dataclass
class Grant:
    """One call's reservation."""

    input_bound: int
    output: int | None  # the ceiling the call is forwarded with (None: no cap applies and the request set none)
    cost: Decimal  # the worst case in dollars (0 when unpriced or no dollar cap)
    day_key: str = ""  # the day's token counter holding its worst case ("" when no day cap applies)
    settled: bool = False

    @property
    def tokens(self) -> int:
        return self.input_bound + (self.output or 0)


class CallBudget:
    """One job's reservations. Lives on the gateway's event loop: no lock beyond the loop itself."""

    def __init__(self, *, max_tokens: int | None, max_cost_micros: int | None, daily_token_cap: int | None, redis,
                 now):
        self.max_tokens = max_tokens
        self.max_cost = money.to_usd(max_cost_micros) if max_cost_micros is not None else None
        self.daily_token_cap = daily_token_cap
        self.redis = redis
        self.now = now
        self.spent_tokens = 0
        self.spent_cost = Decimal(0)
        self.held_tokens = 0
        self.held_cost = Decimal(0)
        self.in_flight = 0
        self._settled = asyncio.Condition()

    @property
    def dollar_cap_applies(self) -> bool:
        return self.max_cost is not None

    def exhausted(self) -> str | None:
        """The cap the job's settled spend has reached, if any (nothing more can be forwarded)."""
        if self.max_tokens and self.spent_tokens >= self.max_tokens:
            return "token-budget"
        if self.max_cost is not None and self.spent_cost >= self.max_cost:
            return "cost-cap"
        return None

    async def reserve(self, rates: Rates | None, input_bound: int, requested: int | None) -> Grant:
        """The call's reservation, its output ceiling lowered to what is left; BudgetRefused when nothing is."""
        async with self._settled:
            while True:
                try:
                    output = self._room(rates, input_bound, requested)
                    break
                except BudgetRefused:
                    if not self.in_flight:
                        raise
                    await self._settled.wait()  # what the calls in flight really used may leave room
            cost = rates.cost(input_bound, output or 0) if rates is not None and self.dollar_cap_applies else Decimal(0)
            grant = Grant(input_bound, output, cost)
            if self.daily_token_cap:
                grant.output = self._reserve_day(grant)
                grant.cost = (rates.cost(input_bound, grant.output) if rates is not None and self.dollar_cap_applies
                              else Decimal(0))
            self.held_tokens += grant.tokens
            self.held_cost += grant.cost
            self.in_flight += 1
            return grant

    def _room(self, rates: Rates | None, input_bound: int, requested: int | None) -> int | None:
        """The largest output ceiling the job's own caps leave for this call (None: unbounded)."""
        output, binding = requested, ""
        if self.max_tokens:
            left = self.max_tokens - self.spent_tokens - self.held_tokens - input_bound
            if output is None or left < output:
                output, binding = left, "token-budget"
        if self.max_cost is not None and rates is not None:
            left_cost = self.max_cost - self.spent_cost - self.held_cost - rates.input * input_bound
            room = int((left_cost / rates.output).to_integral_value(rounding=ROUND_FLOOR)) if rates.output else None
            if left_cost < 0:
                room = -1
            if room is not None and (output is None or room < output):
                output, binding = room, "cost-cap"
        if binding and output < MIN_OUTPUT_TOKENS:
            raise BudgetRefused(binding)
        return output

    def _reserve_day(self, grant: Grant) -> int:
        """Hold the worst case in the day's token counter, fleet-wide; the ceiling lowered to the day's room."""
        key = budget.tokens_key(self.now())
        granted = budget.reserve_call_tokens(self.redis, key, grant.input_bound, grant.output,
                                             MIN_OUTPUT_TOKENS, self.daily_token_cap)
        if granted is None:
            raise BudgetRefused("daily-token-cap")
        grant.day_key = key
        return granted

    async def settle(self, grant: Grant, tokens: int, cost: Decimal | None) -> None:
        """The call ended having used `tokens` and `cost` (None: unpriced). Runs whatever ended the call."""
        if grant.settled:
            return
        grant.settled = True
        async with self._settled:
            self.held_tokens -= grant.tokens
            self.held_cost -= grant.cost
            self.in_flight -= 1
            self.spent_tokens += tokens
            self.spent_cost += cost or Decimal(0)
            self._settled.notify_all()

    def day_adjustment(self, grant: Grant, tokens: int) -> tuple[str, int]:
        """(day key, tokens to add) that turn the day counter's reservation into what was used."""
        if grant.day_key:
            return grant.day_key, tokens - grant.tokens
        return budget.tokens_key(self.now()), tokens


def now_utc() -> datetime:
    from django.utils import timezone

    return timezone.now()

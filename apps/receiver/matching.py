"""Matching: a verified, normalised event against the forge's rules, behind the actor gates.

Pure: rules and our own identity come in, a Decision comes out; nothing is read or written here. Gate
order (reference 4.1): actor id present (`missing-sender-id`), bot-loop guard (`self`), then the route and
its rules. Every actor gate but one needs the forge API: the Decision says which lookup must still pass
(`Match.authority`), so a lookup is only ever paid for an event that would otherwise start a job. The one
exception is a GitHub `labeled` event, whose label is the approval. GitHub's `author_association` is never
trusted: MEMBER is any member of the organisation and COLLABORATOR includes the read role, so GitHub asks
the repository permission (write, maintain or admin) as GitLab, Forgejo and Azure ask theirs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from apps import forge_registry
from apps.worker.forges import Identity

from .hooks.base import ForgeEvent
from .validation import CLOSE_WORDS, PR_LABEL_ACTIONS, REVIEW_ACTION

API_GATED_FORGES = {forge.name for forge in forge_registry.FORGES if forge.api_gated}
AUTO_PR_ACTIONS = {"opened", "synchronize", "reopened"}
# GitHub: applying a label needs triage or write access, so `labeled` is the approval. An issue opened (say,
# from a template that carries the label) or reopened with the label already on is its author's doing, as
# often as they like: the opener's write access is asked, as a closer's is.
LABEL_ARRIVAL_ACTIONS = {"opened", "reopened"}


@dataclass(frozen=True)
class Match:
    trigger: object  # a Trigger row
    matched: dict  # the decision record carried in the job's context (index, type, label/phrase/action...)
    flow: str = ""
    command: str = ""
    close: bool = False
    # Which forge-API lookup must still allow whom: "" none; "actor" (GitLab, Forgejo, Azure; GitHub comments,
    # reviews and issues opened or reopened with the label on), "closer" (GitHub close rules), "pr-author"
    # (GitHub's automatic pull request actions); and the drop reason when it does not.
    authority: str = ""
    refusal: str = ""


@dataclass(frozen=True)
class Decision:
    match: Match | None = None
    reason: str = ""  # the drop token when nothing fires


def _drop(reason: str) -> Decision:
    return Decision(reason=reason)


def _needs(decision: Decision, authority: str, refusal: str) -> Decision:
    """The decision, its match (if any) waiting for the `authority` lookup, refused as `refusal`."""
    if decision.match is None:
        return decision
    return Decision(match=replace(decision.match, authority=authority, refusal=refusal))


def is_self(event: ForgeEvent, identity: Identity) -> bool:
    actor = event.actor
    if actor.id is not None and identity.id and actor.id.lower() == identity.id.lower():
        return True
    # Azure actors may be known only by email; an empty side never matches.
    return bool(actor.email and identity.email and actor.email.lower() == identity.email.lower())


def decide(event: ForgeEvent, identity: Identity, rules) -> Decision:
    """`rules`: the enabled, armed, non-cron triggers of every forge, in file order."""
    if event.actor.id is None:
        return _drop("missing-sender-id")
    if is_self(event, identity):
        return _drop("self")
    if event.route is None:
        return _drop(event.drop_reason)
    own = [rule for rule in rules if rule.kind == event.forge]
    known_flows = {rule.flow for rule in rules if rule.flow}
    route = {"label": _label_route, "comment": _comment_route, "pull_request": _pull_request_route,
             "close": _close_route}[event.route]
    decision = route(event, own, known_flows)
    if decision.match is not None and event.forge in API_GATED_FORGES and not decision.match.authority:
        decision = _needs(decision, "actor", "author-not-allowed")
    return decision


def _of_type(rules, on_type: str):
    return [rule for rule in rules if rule.on_type == on_type]


def _work(rule) -> dict:
    return {"flow": rule.flow, "command": rule.command}


def _needs_repository(event: ForgeEvent, rule) -> bool:
    """Azure work items take the repository from the rule, and need the payload's project for it."""
    return event.repo_from_rule and not (event.project and rule.repository)


# --- label ---------------------------------------------------------------------------------------------------

def _label_route(event: ForgeEvent, rules, known_flows) -> Decision:
    for rule in _of_type(rules, "label"):
        if rule.labels_match(event.labels):
            if _needs_repository(event, rule):
                return _drop("no-repository")
            matched = {"index": rule.position, "type": "label", "label": rule.matched_label(event.labels)}
            decision = Decision(match=Match(trigger=rule, matched=matched, **_work(rule)))
            if event.forge == "github" and event.rule_action in LABEL_ARRIVAL_ACTIONS:
                return _needs(decision, "actor", "author-not-allowed")
            return decision
    return _drop("no-allowlisted-label")


# --- comment -------------------------------------------------------------------------------------------------

def _comment_route(event: ForgeEvent, rules, known_flows) -> Decision:
    decision = _comment_match(event, rules, known_flows)
    return _needs(decision, "actor", "author-not-allowed") if event.forge == "github" else decision


def _comment_match(event: ForgeEvent, rules, known_flows) -> Decision:
    rule = next(iter(_of_type(rules, "comment")), None)
    if rule is None or not rule.phrase or rule.phrase not in event.comment:
        return _drop("no-trigger-phrase")
    if _needs_repository(event, rule):
        return _drop("no-repository")
    matched = {"index": rule.position, "type": "comment", "phrase": rule.phrase}
    if rule.command:
        # The phrase alone fires a command; words after it are data for the command, never a choice.
        return Decision(match=Match(trigger=rule, matched=matched, command=rule.command))
    flow = rule.flow
    chosen = re.search(re.escape(rule.phrase) + r"\s+(\S+)", event.comment)
    if chosen and chosen.group(1) in known_flows:
        flow = chosen.group(1)
    if not flow:
        return _drop("no-flow")
    return Decision(match=Match(trigger=rule, matched=matched, flow=flow))


# --- pull request --------------------------------------------------------------------------------------------

def _has_predicate(rule) -> bool:
    return bool(rule.label_any or rule.label_all or rule.label_none)


def _pr_rules(event: ForgeEvent, rules):
    close_word = CLOSE_WORDS.get(event.forge)
    return [rule for rule in _of_type(rules, "pull_request")
            if event.rule_action in rule.actions and close_word not in rule.actions]


def _pr_and_label_rules(event: ForgeEvent, rules):
    """The pull request rules naming the action and, when the event brings labels, the Label rules: in file
    order, so the first that matches wins whichever its type."""
    pr_rules = _pr_rules(event, rules)
    return [rule for rule in rules if rule in pr_rules or (event.label_arrival and rule.on_type == "label")]


def _pr_match(event: ForgeEvent, rule, *, label: bool = False) -> Decision:
    if label:
        matched = {"index": rule.position, "type": "label", "label": rule.matched_label(event.labels)}
    else:
        matched = {"index": rule.position, "type": "pull_request", "action": event.rule_action}
    return Decision(match=Match(trigger=rule, matched=matched, **_work(rule)))


def _pull_request_route(event: ForgeEvent, rules, known_flows) -> Decision:
    if event.forge == "github" and event.rule_action == REVIEW_ACTION:
        return _github_review(event, _pr_rules(event, rules))
    for rule in _pr_and_label_rules(event, rules):
        decision = _label_rule_on_pr(event, rule) if rule.on_type == "label" else _pr_rule(event, rule)
        if decision is not None:
            return decision
    return _drop("no-matching-pr-trigger")


def _label_rule_on_pr(event: ForgeEvent, rule) -> Decision | None:
    """A Label rule sees a pull request as it sees an issue (the same label set per forge)."""
    if not rule.labels_match(event.labels):
        return None
    decision = _pr_match(event, rule, label=True)
    if event.forge == "github" and event.rule_action in LABEL_ARRIVAL_ACTIONS:
        return _needs(decision, "actor", "author-not-allowed")  # opened/reopened with the label: the author's doing
    return decision  # GitHub `labeled`: applying a label already needs triage or write access


def _pr_rule(event: ForgeEvent, rule) -> Decision | None:
    if event.forge == "github":
        if event.rule_action == PR_LABEL_ACTIONS["github"]:
            # Applying a label already needs write access: the label is the approval.
            return _pr_match(event, rule) if rule.labels_match(event.labels) else None
        if not _has_predicate(rule) or rule.labels_match(event.labels):
            # The job works on the author's branch and text, whoever pushed or reopened: the author must write.
            return _needs(_pr_match(event, rule), "pr-author", "pr-author-not-allowed")
        return None
    if event.forge == "gitlab":
        if rule.has_positive_selector:
            return _pr_match(event, rule, label=True) if rule.labels_match(event.labels) else None
        return _pr_match(event, rule)  # fires on the action alone
    # Forgejo (predicate over the whole label set) and Azure (no predicates)
    return _pr_match(event, rule) if not _has_predicate(rule) or rule.labels_match(event.labels) else None


def _github_review(event: ForgeEvent, candidates) -> Decision:
    # The reviewer's access, never the PR author's.
    return _needs(_github_review_match(event, candidates), "actor", "review-author-not-allowed")


def _github_review_match(event: ForgeEvent, candidates) -> Decision:
    review = event.review or {}
    state = review.get("state", "")
    if state == "commented" and not str(review.get("body") or "").strip():
        return _drop("no-review-body")
    state_only = False
    for rule in candidates:
        if rule.review_states and state not in rule.review_states:
            state_only = True
            continue
        if not _has_predicate(rule) or rule.labels_match(event.labels):
            return _pr_match(event, rule)
    return _drop("review-state-not-matched" if state_only else "no-matching-pr-trigger")


# --- close ---------------------------------------------------------------------------------------------------

def _close_route(event: ForgeEvent, rules, known_flows) -> Decision:
    close_word = CLOSE_WORDS.get(event.forge)
    rule_type = "issue" if event.target_type == "issue" else "pull_request"
    numbered_elsewhere = False
    for rule in _of_type(rules, rule_type):
        if close_word not in rule.actions:
            continue
        if rule.number is not None and rule.number != event.number:
            numbered_elsewhere = True
            continue
        matched = {"index": rule.position, "type": rule_type, "action": close_word}
        if rule_type == "issue":
            matched["number"] = event.number
        if rule.once:
            matched["once"] = True
        github = event.forge == "github"
        return Decision(match=Match(
            trigger=rule, matched=matched, close=True, **_work(rule),
            authority="closer" if github else "", refusal="closer-not-allowed" if github else "",
        ))
    if event.label_fallback:
        # GitLab: one click that closes and labels an issue yields at most one job.
        fallback = _label_route(event, rules, known_flows)
        if fallback.match is not None:
            return fallback
    return _drop("close-number-not-matched" if numbered_elsewhere else "no-matching-close-trigger")

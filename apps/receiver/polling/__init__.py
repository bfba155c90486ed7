"""The GitHub poller: for a deployment that no webhook can reach (`python manage.py poll_github`).

Every POLL_INTERVAL_SECONDS (at least 30) it reads, per repository of POLL_REPOS (or of the GitHub App's
installation), three of GitHub's REST feeds with conditional requests (the ETag it got last time as
`If-None-Match`: an unchanged feed answers 304, which GitHub does not count against the rate limit), turns each
new item into the webhook payload it corresponds to, and hands it to the same intake as a webhook
(apps/receiver/intake.py: the inbox, matching, gates, authority lookups, the dedup windows, routing):

    issue events    GET /repos/{repo}/issues/events          labeled, closed  -> `issues` / `pull_request`
    issue comments  GET /repos/{repo}/issues/comments        new comments     -> `issue_comment` created
    pull requests   GET /repos/{repo}/pulls?state=open       new, pushed to, reopened -> `pull_request`

Delivery ids are the ancestor's: `poll-e<event id>`, `poll-c<comment id>`, `poll-pr<number>-<head sha 7>`; job
ids `gh-poll-...`. A delivery a webhook also brought is the same target and flow, so the semantic dedup window
(PI_DEDUP_WINDOW_SECONDS) lets only the first start a job, whichever came first.

Cursors (`PollCursor`, one row per repository) live in the database: a restart resumes where the last poll
stopped, and an item handed to the intake twice (a crash between the two writes) is answered from the inbox,
whose rows are keyed by the delivery id. A repository's first poll arms it: what is already there starts nothing.

Nothing of an issue (title, body, comment text, logins) is logged or kept beyond the inbox's own rules.
"""

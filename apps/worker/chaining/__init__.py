"""Chaining: a completed run may ask for follow-up jobs by writing request files into its `/outbox`.

    outbox.read(folder, max_requests)      the requests the agent left, each judged on its own (outbox.py)
    skills.chainable_flows(...)            the flows whose SKILL.md allows being chained, read before the agent ran
    service.collect(spec, ...)             the children enqueued for one completed run (service.py)

The agent is hostile: the worker reads only `request-<n>.json` files, regular ones (never through a link, never a
fifo), at most 4 KiB each, at most PI_CHAIN_MAX_PER_JOB of them; a request names a flow and a task, never a
command. A child is an ordinary job on the parent's own target, through every gate and cap, without the parent's
secrets; its id comes from its parent's id, flow and task, so a request made again names the same job.
Refusals are counted per reason token on the parent's run record (`chain_refusals`), never failures of the run.
"""

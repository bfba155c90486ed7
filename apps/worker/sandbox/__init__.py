"""The job's sandbox: its single-use container, the files it gets, what it may reach and how its spending is known.

    container       the locked-down container (no network, no credential, limits, labels, deadline)
    jobfiles        the job's folder under PI_JOB_ROOT (prompt, clone), held while a live work horse runs it
    workspace       a local job's folder and its git config check; forge_workspace: a forge job's clone
    gitrun          git in a closed environment; repo_skills: the repository's own pi skills
    disk            the workspace's disk bound; exitline: the runner's summary line

    image_contract  the labels and paths a job image and this worker agree on (runner protocol)
    providers       a provider's real endpoint, API kind and key variable (pi_registry.json: pinned pi's own)
    agent_config    the models.json that points pi at its gateway
    gateway         the per-job egress gateway: the provider proxy that adds the key, and the allowlist proxy
    egress_policy   PI_EGRESS_ALLOW
    metering        token usage from each provider API's own answers
    prices          dollars per model (pi's list prices, under the operator's)
"""

"""The job's sandbox: what the container may reach and how its spending is known.

    image_contract  the labels and paths a job image and this worker agree on (runner protocol)
    providers       a provider's real endpoint, API kind and key variable (pi_registry.json: pinned pi's own)
    agent_config    the models.json that points pi at its gateway
    gateway         the per-job egress gateway: the provider proxy that adds the key, and the allowlist proxy
    egress_policy   PI_EGRESS_ALLOW
    metering        token usage from each provider API's own answers
    prices          dollars per model (pi's list prices, under the operator's)
"""

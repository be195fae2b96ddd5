"""The parts of the rollout balancer (flexmarl.rollout.balancer), each pure: no asyncio, no I/O.

    routing.py   strategies that choose an instance among candidates (round robin, least
                 loaded), the same interface at both levels; episode stickiness
    loads.py     the instances' outstanding work, per instance and per agent
    forecast.py  what is learnt from the past: a step's demand profile (the prediction of the
                 next), demand averaged over a window, decode rates
    moves.py     the inter-agent level: which instance moves where, and whether it pays
"""

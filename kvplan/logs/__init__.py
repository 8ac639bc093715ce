"""Engine startup logs: reading them (logparse.py), checking a plan against one (checklog.py), and
the non-KV overheads measured from them and saved on this machine (overheads.py). May import
kvplan.plan and every stage below it.
"""

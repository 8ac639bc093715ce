"""Many plans: comparisons of variants of one request (compare.py: rows, ladders) and the search
for the cheapest cluster that serves a load (solve.py). May import kvplan.plan and every stage
below it.
"""

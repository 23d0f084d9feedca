"""`groupbuy demo`: a small flash sale played against a running service, bounded in rate
and time, so the console has something to show.

One module per job: `plan` (the options and the sale's parameters), `pacer` (the request
rate), `tally` (the counts, the progress line and the summary), `receiver` (the loopback
webhook receiver that verifies each delivery), `shoppers` (locks, payments, abandons, the
waitlist), `storm` (the red-packet storm) and `runner` (set-up, the run, clean-up).
"""

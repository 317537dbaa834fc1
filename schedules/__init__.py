"""Schedules: a customer's agent work at cron times (with a time zone) or once at a moment (issue 35).

A schedule fires a task kind with parameters or a message into a thread, through the conversations inbox; each
fire time is one ``ScheduleFire`` row keyed (schedule, fire time) and the inbox item it started is keyed by the
same fire, so a fire happens once whatever is killed when.
"""

"""The running instances, one by one and across the machine: start, stop and submit (``instances``), what an
operator does to one (``actions``: suspend, resume, restart), scale to zero (``sleep``), rolling restarts
(``rolling``) and the isolation posture report (``posture``, ``posture_inside``).
"""

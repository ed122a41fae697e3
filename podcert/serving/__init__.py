"""Bounded serving for every port podcert listens on: connections counted from the accept,
the longest idle closed first when full, deadlines for handshakes and request heads.

`connections` (the pure table), `servers` (aiohttp ports under it), `health` (the metrics and
probe port's bounded threaded server).
"""

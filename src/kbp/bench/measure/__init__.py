"""The benchmark's measurements, one module each, on a run context (:class:`kbp.bench.
runner.Bench`: its testbed, RT application, modes and results): ``latency`` (one RT
request/response latency run), ``throughput`` (one RFC 2544 zero-loss search), ``idle`` (one
mode's idle cost).  The parts (:mod:`kbp.bench.parts`) and the scenarios compose them.
"""

"""Route interactive requests by predicted time per output token (speculative decoding where it pays).

A speculative pool cuts TPOT when drafts are accepted and its batch is small; at low acceptance (free prose) or a
large batch the verification of K drafts per sequence costs more than it saves. From the engines' own /metrics
(inter-token latency, spec-decode counters) and the gateway's streams this package predicts, per pool,
TTFT + output tokens x TPOT for the request at hand, and sends an interactive request to the pool where it ends
first (with hysteresis and session affinity):

  kind.py        what the request asks for (code, tool arguments, prose): a cheap classifier, counts only
  step_fit.py    step time of a pool's engines as a function of decode batch size (fitted online)
  acceptance.py  tokens per decode step per pool, and per (pool, tenant, kind) from streams
  feed.py        scrape deltas of each replica's counters into the two above
  predict.py     the prediction for one pool (and its header text)
  router.py      the chooser pick() calls (cluster.tpot), and what a finished request feeds back
  metrics.py     acceptance, predicted vs observed TPOT, routed-by-TPOT counts on /metrics
  hook.py        the PathHook the gateway registers when the config enables it (its settings: app/config/tpot.py)
"""

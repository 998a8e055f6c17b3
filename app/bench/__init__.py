"""`kvgate bench`: load generator and meter for any OpenAI-compatible endpoint."""

from app.bench.report import BenchResult, Summary
from app.bench.runner import run_bench, run_sweep
from app.bench.spec import BenchSpec, Pricing, RequestRecord

__all__ = ["BenchResult", "BenchSpec", "Pricing", "RequestRecord", "Summary", "run_bench", "run_sweep"]

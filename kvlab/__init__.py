"""The test and lab harness shared by tests/ and experiments/: free ports, child processes and their readiness,
gateway configs, and the stacks and fakes both run.

Not part of the shipped package (pyproject's packages are app*); nothing here imports tests/, and experiments
import only this (with the checkout on sys.path). What needs kvgate itself starts it as a process (`KVGATE`).
"""

"""The side-by-side harness behind `kernel-fun bench` (harness.py) and one module of cases per
family (cconv.py, ...), each with the interpreted correctness check behind `kernel-fun check`."""

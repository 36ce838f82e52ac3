"""Measured runs: records, log parsers, prediction of runs, comparison and calibration."""

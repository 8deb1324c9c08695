"""Nightshift: tune deep-learning models with Apache TVM, Ray and a SQL tuning database."""

__version__ = "0.1.0"

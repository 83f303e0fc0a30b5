"""Helpers shared by the test modules (on pytest's pythonpath as ``support``).

Test modules import from here and never from one another or from conftest, so each module
is collected once and a helper has one implementation.
"""

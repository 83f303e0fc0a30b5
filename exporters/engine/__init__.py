"""The engine source: one scrape of the engine's page, read, checked and mapped onto the catalogue.

``collector`` drives a scrape and keeps the engine's health; ``adapters`` maps each engine's
spelling of a signal onto ours; ``checks`` bounds what one page may put into the output;
``counter_resets`` keeps counters monotonic across an engine restart.
"""

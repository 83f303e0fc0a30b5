"""Canary analysis: is a candidate version (model, engine or prompt) as good as its baseline.

``stats`` holds the tests, ``selector`` the user's label matchers, ``checks`` what is compared
and the PromQL that fetches it, ``analysis`` the verdict, ``templates`` the same checks for
Argo Rollouts and Flagger, ``splits`` the gateway's split header the proxy records.
"""

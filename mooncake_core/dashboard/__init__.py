"""Live dashboards of the services (``/dashboard`` on the master's HTTP port and on the proxy).

``window`` (pure: rates, ratios and percentiles over a sliding window), ``samples`` (Prometheus
families -> a window sample), ``page`` (the self-contained HTML), ``master`` (the master's view).
"""

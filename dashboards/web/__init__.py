"""Browser dashboards: a Bokeh server app (app.py, `rose dashboard`) with four pages, each a module
that turns the recorded data (data.py, read through storage.catalog) into figures: runs.py,
serving.py, routing.py, transfer.py; plots.py holds what they draw with, links.py where they
are served. Pages never import each other.
"""

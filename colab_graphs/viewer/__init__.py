"""`colab-graphs view`: a local web app over any output folder (audits, runs, studies, training runs).

    >>> from colab_graphs.viewer import ViewerServer
    >>> server = ViewerServer("audits/vote", port=0).start()  # doctest: +SKIP
    >>> server.url                                             # doctest: +SKIP
    'http://127.0.0.1:40123/'

The page, its script and its style ship in the package (`static/`): plain HTML, JavaScript and CSS, no build
step and nothing loaded from the network.
"""

from colab_graphs.viewer.server import ViewerServer

__all__ = ["ViewerServer"]

"""The Hydra front end and the Molt launcher (`molt-flashreinforce`); see `app.py`."""

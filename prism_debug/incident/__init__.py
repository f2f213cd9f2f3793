"""From a production incident's flight-recorder dumps to a reproduction.

``dumps`` reads a directory of torch's flight-recorder pickles as untrusted
input; ``analysis`` says what happened (where each group stopped, who never
arrived or arrived with the wrong call, who left no dump); ``placement``
finds the iteration and op of that collective in the job's execution graph;
``reproduce`` writes the scenario that replays it; ``skeleton`` builds an
execution graph from the dumps alone, for a job whose code is not at hand.
Pure: no torch, CRIU, ZeroMQ or click.
"""

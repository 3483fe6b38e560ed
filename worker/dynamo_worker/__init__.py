"""Everything that runs inside the pods of a graph: frontend, routers, workers, mocker, dynamo-run."""

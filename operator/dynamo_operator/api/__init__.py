"""Pydantic models of the DynamoGraphDeployment CRD and the worker launch contract. Pure."""

"""The kopf operator for DynamoGraphDeployment (nvidia.com/v1alpha1)."""

"""The kopf operator for DynamoGraphDeployment (nvidia.com/v1beta1, stored, and nvidia.com/v1alpha1)."""

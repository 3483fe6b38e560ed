-- Argo CD health of a DynamoGraphDeployment (nvidia.com/v1alpha1).
-- Healthy:     the operator has seen the current generation and the Ready condition is True.
-- Degraded:    the operator gave up on this generation (status.state "failed", e.g. an invalid spec).
-- Progressing: anything else: not yet observed, rolling out, waiting for pods or GPUs.
local hs = {status = "Progressing", message = "Waiting for the operator to observe the latest spec"}
if obj.status == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  return hs
end
local ready = nil
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    end
  end
end
if obj.status.state == "failed" then
  hs.status = "Degraded"
  hs.message = (ready ~= nil and ready.message) or "The operator reported state failed"
  return hs
end
if ready == nil then
  hs.message = "Waiting for the Ready condition"
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
else
  hs.status = "Progressing"
end
hs.message = ready.message or ready.reason or ""
return hs

# A Knative Route (kubectl get routes.serving.knative.dev NAME -o json) as a local-activator
# Route; --arg host HOST names the Host it answers (Knative's is in .status.url). A target
# with latestRevision: true follows the newest local-activator Revision claiming the host;
# tags keep their names (<tag>-<host>). Targets Knative gives no percent take 0; the
# annotation serving.knative.dev/rollout-duration (e.g. 300s, 5m) becomes
# rolloutDurationSeconds.
def seconds: capture("^(?<n>[0-9]+)(?<u>[smh]?)$") as $d
  | ($d.n | tonumber) * ({"": 1, s: 1, m: 60, h: 3600}[$d.u]);
((.metadata.annotations // {})["serving.knative.dev/rollout-duration"]) as $rollout
| {
  apiVersion: "local-activator.dev/v1alpha1",
  kind: "Route",
  metadata: {name: .metadata.name, namespace: .metadata.namespace},
  spec: ({
    hosts: [$host],
    traffic: [.spec.traffic[] | (
      (if .latestRevision == true then {latestRevision: true}
       else {revisionName: .revisionName} end)
      + {percent: (.percent // 0)}
      + (if .tag then {tag: .tag} else {} end))]
  } + (if $rollout then {rolloutDurationSeconds: ($rollout | seconds)} else {} end))
}

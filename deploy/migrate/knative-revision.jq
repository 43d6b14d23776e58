# A Knative Revision (kubectl get revisions.serving.knative.dev NAME -o json) as a
# local-activator Revision; --arg host HOST names the Host it answers.
def num($a; $k):
  if $a[$k] then {($k | split("/")[1] | gsub("-(?<c>[a-z])"; .c | ascii_upcase)): ($a[$k] | tonumber)}
  else {} end;
def probe($p; $port):
  if .[$p] == null then .
  elif .[$p].tcpSocket != null and (.[$p].tcpSocket.port // 0) == 0 then .[$p].tcpSocket.port = $port
  elif .[$p].httpGet != null and (.[$p].httpGet.port // 0) == 0 then .[$p].httpGet.port = $port
  else . end;
(.metadata.annotations // {}) as $a
| (.spec.containers[0].ports[0].containerPort // 8080) as $port
| {
  apiVersion: "local-activator.dev/v1alpha1",
  kind: "Revision",
  metadata: {name: .metadata.name, namespace: .metadata.namespace},
  spec: ({
    hosts: [$host],
    port: $port,
    containerConcurrency: (.spec.containerConcurrency // 0),
    timeoutSeconds: (.spec.timeoutSeconds // 300),
    template: {
      metadata: {labels: ((.metadata.labels // {})
        | with_entries(select(.key | startswith("serving.knative.dev/") | not)))},
      spec: (.spec
        | del(.containerConcurrency, .timeoutSeconds, .responseStartTimeoutSeconds, .idleTimeoutSeconds)
        | .containers |= map(
            .env //= []
            | if any(.env[]; .name == "PORT") then . else .env += [{name: "PORT", value: ($port | tostring)}] end
            | probe("readinessProbe"; $port) | probe("livenessProbe"; $port)))
    }
  } + num($a; "autoscaling.knative.dev/min-scale") + num($a; "autoscaling.knative.dev/max-scale")
    + num($a; "autoscaling.knative.dev/target-burst-capacity"))
}

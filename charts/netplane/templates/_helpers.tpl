{{/* Names and labels shared by every object of the chart. */}}

{{- define "netplane.name" -}}netplane{{- end -}}

{{- define "netplane.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "netplane.labels" -}}
app.kubernetes.io/name: netplane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* selector ROLE: the labels that select one role's pods. */}}
{{- define "netplane.selector" -}}
app.kubernetes.io/name: netplane
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{/*
config ROLE SECTION: the Configuration file of one role. Only the role's own
section is rendered, so a change to the DNS settings rolls only DNS pods.
*/}}
{{- define "netplane.config" -}}
apiVersion: netplane.io/v1alpha1
kind: Configuration
roles: [{{ .role }}]
{{- $cc := deepCopy .root.Values.config.clientConnection }}
{{- if and (eq .role "node") .root.Values.node.controlPlaneEndpoint }}
{{- /* In the file, so that `netplane explain` in the agent's pod reads it too. */}}
{{- $_ := set $cc "controlPlaneEndpoint" .root.Values.node.controlPlaneEndpoint }}
{{- end }}
clientConnection:
{{ toYaml $cc | indent 2 }}
healthBindAddress: {{ .health | quote }}
metricsBindAddress: {{ .metrics | quote }}
{{- with .shutdown }}
shutdownTimeout: {{ . }}
{{- end }}
{{ .section }}:
{{ toYaml .values | indent 2 }}
{{- end -}}

{{/* args: the command line every role shares. */}}
{{- define "netplane.args" -}}
- --config=/etc/netplane/config.yaml
- --v={{ .Values.logVerbosity }}
{{- end -}}

{{/* The three roles' Configuration files; their checksums roll only their own pods. */}}
{{- define "netplane.controllerConfig" -}}
{{- include "netplane.config" (dict "root" . "role" "controller" "section" "controller" "values" .Values.controller.config "health" "0.0.0.0:10290" "metrics" "0.0.0.0:10291") }}
{{- end -}}

{{- /* The DNS pods answer after SIGTERM until the Service's EndpointSlices drop
them, for at most the shutdown timeout less 2 s; the
pods' grace period (30 s) covers it. */}}
{{- define "netplane.dnsConfig" -}}
{{- $fixed := dict "bindAddress" ":53" "dnsService" (printf "%s/%s" .Release.Namespace .Values.dns.service.name) }}
{{- include "netplane.config" (dict "root" . "role" "dns" "section" "dns" "values" (merge $fixed (deepCopy .Values.dns.config)) "health" "0.0.0.0:10290" "metrics" "0.0.0.0:9153" "shutdown" "25s") }}
{{- end -}}

{{/* The node agent sees the host's CNI folders under /host; the plugin ships in the image. */}}
{{- define "netplane.nodeConfig" -}}
{{- $fixed := dict "cniBinDir" "/host/opt/cni/bin" "cniConfDir" "/host/etc/cni/net.d" "ipamStateDir" (printf "%s/ipam" .Values.node.stateDir) "cniPluginPath" "/usr/local/bin/netplane-cni" "procSysDir" "/host/proc/sys" "agentSocket" (printf "%s/agent.sock" .Values.node.stateDir) "networkPolicy" .Values.networkPolicy "overlay" .Values.overlay "encryption" (include "netplane.encryption" . | fromYaml) }}
{{- if .Values.relay.enabled }}
{{- $_ := set $fixed "podRelay" (dict "service" (printf "%s/netplane-relay" .Release.Namespace) "caFile" "/etc/netplane-relay/ca.crt") }}
{{- end }}
{{- /* Metrics on kube-proxy's port: tools and upstream's tests ask 127.0.0.1:10249/proxyMode. */}}
{{- include "netplane.config" (dict "root" . "role" "node" "section" "node" "values" (merge $fixed (deepCopy .Values.node.config)) "health" "0.0.0.0:10290" "metrics" "0.0.0.0:10249" "shutdown" "25s") }}
{{- end -}}

{{/* The relays' health and metrics on ports of their own: they share the host network
with the node agent, whose ports are shared (SO_REUSEPORT) between its own processes. */}}
{{- define "netplane.relayConfig" -}}
{{- $fixed := dict "bindAddress" (printf "0.0.0.0:%v" .Values.relay.port) "tlsCertFile" "/etc/netplane-relay/tls.crt" "tlsKeyFile" "/etc/netplane-relay/tls.key" }}
{{- include "netplane.config" (dict "root" . "role" "relay" "section" "relay" "values" $fixed "health" "0.0.0.0:10293" "metrics" "0.0.0.0:10294") }}
{{- end -}}

{{/* The node section's encryption: the chart's values, the key file in keyDir. */}}
{{- define "netplane.encryption" -}}
{{- $e := .Values.encryption -}}
mode: {{ $e.mode }}
wireguardPort: {{ $e.wireguardPort }}
implementation: {{ $e.implementation }}
permissive: {{ $e.permissive }}
privateKeyFile: {{ printf "%s/private.key" $e.keyDir }}
{{- end -}}

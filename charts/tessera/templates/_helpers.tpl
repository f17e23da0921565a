{{/* The name prefix of every object: release-chart, or fullnameOverride. */}}
{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
{{- end -}}

{{/* Selector labels of one part: (dict "root" $ "component" "apiserver" "shard" "shard-0"). */}}
{{- define "tessera.selector" -}}
app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .shard }}
tessera.io/shard: {{ .shard }}
{{- end }}
{{- end -}}

{{/* Every label of one part. */}}
{{- define "tessera.partLabels" -}}
{{ include "tessera.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- if .shard }}
tessera.io/shard: {{ .shard }}
{{- end }}
{{- end -}}

{{/* The object name of one part: fullname-[shard-]component. */}}
{{- define "tessera.partName" -}}
{{- $full := include "tessera.fullname" .root -}}
{{- if .shard -}}
{{- printf "%s-%s-%s" $full .shard .component | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" $full .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The Secret with one API server's credentials: (dict "root" $ "shard" "shard-0"), no shard for the federation's. */}}
{{- define "tessera.pkiSecret" -}}
{{- $full := include "tessera.fullname" .root -}}
{{- if .shard -}}
{{- printf "%s-%s-pki" $full .shard -}}
{{- else -}}
{{- printf "%s-federation-pki" $full -}}
{{- end -}}
{{- end -}}

{{/* The Tessera image. */}}
{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* A Service's DNS names: (dict "root" $ "name" "svc"). */}}
{{- define "tessera.serviceNames" -}}
{{ .name }},{{ .name }}.{{ .root.Release.Namespace }},{{ .name }}.{{ .root.Release.Namespace }}.svc,{{ .name }}.{{ .root.Release.Namespace }}.svc.{{ .root.Values.clusterDomain }}
{{- end -}}

{{/* The etcd members' client URLs of one etcd StatefulSet: (dict "root" $ "name" "sts"). */}}
{{- define "tessera.etcdClientUrls" -}}
{{- $urls := list -}}
{{- range $i := until (int .root.Values.etcd.replicas) -}}
{{- $urls = append $urls (printf "https://%s-%d.%s.%s.svc:2379" $.name $i $.name $.root.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* The store flags of an API server on etcd: (dict "root" $ "etcd" "sts name" "endpoints" list). */}}
{{- define "tessera.storeArgs" -}}
- --store=etcd
{{- if eq .root.Values.etcd.mode "internal" }}
- --etcd-servers={{ include "tessera.etcdClientUrls" (dict "root" .root "name" .etcd) }}
- --etcd-cafile=/etc/tessera/pki/etcd-ca.crt
- --etcd-certfile=/etc/tessera/pki/etcd-client.crt
- --etcd-keyfile=/etc/tessera/pki/etcd-client.key
{{- else }}
- --etcd-servers={{ join "," .endpoints }}
{{- if .root.Values.etcd.external.tlsSecret }}
- --etcd-cafile=/etc/tessera/etcd/ca.crt
- --etcd-certfile=/etc/tessera/etcd/tls.crt
- --etcd-keyfile=/etc/tessera/etcd/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Whether the Prometheus operator's kinds are to be rendered: (dict "root" $ "enabled" value). */}}
{{- define "tessera.monitoringOn" -}}
{{- if eq (toString .enabled) "auto" -}}
{{- if .root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- else if eq (toString .enabled) "true" -}}true{{- end -}}
{{- end -}}

{{/* The pod-level settings every control-plane pod shares. */}}
{{- define "tessera.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
automountServiceAccountToken: false
securityContext:
  fsGroup: {{ .Values.securityContext.runAsGroup }}
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* Scheduling constraints of a part's values: nodeSelector, tolerations, affinity. */}}
{{- define "tessera.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

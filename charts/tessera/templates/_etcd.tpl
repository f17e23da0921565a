{{/*
An etcd cluster of `etcd.replicas` members with TLS between members and towards clients
(client certificates required), its certificates from an API server's credentials Secret:
(dict "root" $ "name" "<sts>" "secret" "<pki secret>" "shard" "<shard or empty>").
*/}}
{{- define "tessera.etcd" -}}
{{- $root := .root -}}
{{- $v := $root.Values.etcd -}}
{{- $name := .name -}}
{{- $ns := $root.Release.Namespace -}}
{{- $sel := dict "root" $root "component" (ternary "etcd" "federation-etcd" (ne .shard "")) "shard" .shard -}}
{{- $peers := list -}}
{{- range $i := until (int $v.replicas) -}}
{{- $peers = append $peers (printf "%s-%d=https://%s-%d.%s.%s.svc:2380" $name $i $name $i $name $ns) -}}
{{- end -}}
# The members' stable names: <pod>.{{ $name }}.{{ $ns }}.svc (peers find each other before
# they are ready, so not-ready addresses are published).
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ $ns }}
  labels:
    {{- include "tessera.partLabels" $sel | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    {{- include "tessera.selector" $sel | nindent 4 }}
  ports:
    - {name: client, port: 2379, targetPort: client}
    - {name: peer, port: 2380, targetPort: peer}
    - {name: metrics, port: 2381, targetPort: metrics}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $name }}
  namespace: {{ $ns }}
  labels:
    {{- include "tessera.partLabels" $sel | nindent 4 }}
spec:
  serviceName: {{ $name }}
  replicas: {{ $v.replicas }}
  # Members start together: the first cannot be ready before a quorum is up.
  podManagementPolicy: Parallel
  selector:
    matchLabels:
      {{- include "tessera.selector" $sel | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "tessera.partLabels" $sel | nindent 8 }}
    spec:
      {{- include "tessera.podCommon" $root | trim | nindent 6 }}
      {{- with include "tessera.placement" $v | trim }}{{ . | nindent 6 }}{{ end }}
      containers:
        - name: etcd
          image: {{ $v.image.repository }}:{{ $v.image.tag }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: [etcd]
          args:
            - --name=$(POD_NAME)
            - --data-dir=/var/lib/etcd/data
            - --listen-client-urls=https://0.0.0.0:2379
            - --advertise-client-urls=https://$(POD_NAME).{{ $name }}.{{ $ns }}.svc:2379
            - --listen-peer-urls=https://0.0.0.0:2380
            - --initial-advertise-peer-urls=https://$(POD_NAME).{{ $name }}.{{ $ns }}.svc:2380
            - --initial-cluster={{ join "," $peers }}
            - --initial-cluster-state=new
            - --initial-cluster-token={{ $name }}
            - --listen-metrics-urls=http://0.0.0.0:2381
            - --client-cert-auth
            - --trusted-ca-file=/etc/etcd/pki/etcd-ca.crt
            - --cert-file=/etc/etcd/pki/etcd-member.crt
            - --key-file=/etc/etcd/pki/etcd-member.key
            - --peer-client-cert-auth
            - --peer-trusted-ca-file=/etc/etcd/pki/etcd-ca.crt
            - --peer-cert-file=/etc/etcd/pki/etcd-member.crt
            - --peer-key-file=/etc/etcd/pki/etcd-member.key
            - --quota-backend-bytes={{ int64 $v.quotaBackendBytes }}
            # Tessera compacts old revisions itself (its API server's compactor).
            - --snapshot-count=10000
            {{- range $v.extraArgs }}
            - {{ . }}
            {{- end }}
          env:
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
          ports:
            - {name: client, containerPort: 2379}
            - {name: peer, containerPort: 2380}
            - {name: metrics, containerPort: 2381}
          startupProbe:
            httpGet: {path: "/health?serializable=true", port: metrics}
            periodSeconds: 5
            failureThreshold: 60
          livenessProbe:
            httpGet: {path: "/health?serializable=true", port: metrics}
            periodSeconds: 10
            failureThreshold: 8
          readinessProbe:
            httpGet: {path: /health, port: metrics}
            periodSeconds: 5
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          volumeMounts:
            - {name: data, mountPath: /var/lib/etcd}
            - {name: pki, mountPath: /etc/etcd/pki, readOnly: true}
      volumes:
        - name: pki
          secret:
            secretName: {{ .secret }}
            defaultMode: 0440
            items:
              - {key: etcd-ca.crt, path: etcd-ca.crt}
              - {key: etcd-member.crt, path: etcd-member.crt}
              - {key: etcd-member.key, path: etcd-member.key}
  volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: [ReadWriteOnce]
        {{- with $v.persistence.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $v.persistence.size }}
{{- if and $root.Values.podDisruptionBudget.enabled (gt (int $v.replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $ns }}
  labels:
    {{- include "tessera.partLabels" $sel | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      {{- include "tessera.selector" $sel | nindent 6 }}
{{- end }}
{{- end -}}

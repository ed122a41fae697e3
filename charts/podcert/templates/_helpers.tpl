{{/* The signer's image reference: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "podcert.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The example pair's image reference. */}}
{{- define "podcert.examplesImage" -}}
{{ .Values.examples.image.repository }}:{{ .Values.examples.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* imagePullPolicy, only when set (else the cluster's default, as the kustomize bases). */}}
{{- define "podcert.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* The signer names as a CEL list literal: ['a/b', 'c/d']. */}}
{{- define "podcert.signerNamesCEL" -}}
{{- if not .Values.signerNames }}{{ fail "signerNames: name at least one signer" }}{{ end -}}
[{{- range $i, $name := .Values.signerNames }}{{ if $i }}, {{ end }}'{{ $name }}'{{ end }}]
{{- end }}

{{/* The first signer name: the one the example pair's volumes ask. */}}
{{- define "podcert.firstSigner" -}}
{{- if not .Values.signerNames }}{{ fail "signerNames: name at least one signer" }}{{ end -}}
{{ first .Values.signerNames }}
{{- end }}

{{/* The signer name of federated trust domains' ClusterTrustBundles: federation.signerName, else
<the first served signer's domain>/federated, as the signer itself defaults it. */}}
{{- define "podcert.federatedSigner" -}}
{{- if .Values.federation.signerName }}{{ .Values.federation.signerName }}
{{- else }}{{ include "podcert.firstSigner" . | splitList "/" | first }}/federated{{ end }}
{{- end }}

{{/* The names whose ClusterTrustBundles the signer may write, as a CEL list literal: the served
signer names, then the federation's. */}}
{{- define "podcert.trustBundleSignersCEL" -}}
{{- if not .Values.signerNames }}{{ fail "signerNames: name at least one signer" }}{{ end -}}
[{{- range .Values.signerNames }}'{{ . }}', {{ end }}'{{ include "podcert.federatedSigner" . }}']
{{- end }}

{{/* The recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/
common-labels) of one component's objects: `include "podcert.labels" (list $ "signer")`. The
name label is podcert-<component>, as the selectors (immutable on Deployments and DaemonSets)
have always had it. */}}
{{- define "podcert.labels" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
app.kubernetes.io/name: podcert-{{ $component }}
app.kubernetes.io/instance: {{ $root.Release.Name | quote }}
app.kubernetes.io/version: {{ $root.Values.image.tag | default $root.Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/component: {{ $component }}
app.kubernetes.io/part-of: podcert
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* A metadata `labels:` block: the recommended labels, then `extra` (a map) when given:
`include "podcert.metaLabels" (list $ "signer" (dict "k" "v"))`. */}}
{{- define "podcert.metaLabels" -}}
labels:
  {{- include "podcert.labels" (list (index . 0) (index . 1)) | nindent 2 }}
  {{- if gt (len .) 2 }}{{ with index . 2 }}
  {{- toYaml . | nindent 2 }}
  {{- end }}{{ end }}
{{- end }}

{{/* One release per cluster. The signer's ClusterRole, webhook, admission policies, signer names
and ClusterTrustBundles are cluster-wide, and two signers serving one name would fight over its
bundles, so a second release (or an install beside `kubectl apply -k manifests/signer`) is
refused here with one line, before Helm's own less telling ownership error. `lookup` sees
nothing under `helm template` and client-side dry runs, where nothing is installed. */}}
{{- define "podcert.singleRelease" -}}
{{- $found := lookup "rbac.authorization.k8s.io/v1" "ClusterRole" "" "podcert-signer" -}}
{{- if $found -}}
{{- $annotations := $found.metadata.annotations | default dict -}}
{{- $name := index $annotations "meta.helm.sh/release-name" | default "" -}}
{{- $namespace := index $annotations "meta.helm.sh/release-namespace" | default "" -}}
{{- if or (ne $name .Release.Name) (ne $namespace .Release.Namespace) -}}
{{- $owner := ternary "objects applied outside Helm (kubectl apply -k manifests/signer?)" (printf "release %s in namespace %s" $name $namespace) (eq $name "") -}}
{{- fail (printf "podcert is installed once per cluster and is already installed here (ClusterRole podcert-signer belongs to %s): upgrade that release, or uninstall it first" $owner) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The pod-level knobs every podcert pod takes: from a values map with nodeSelector,
tolerations, affinity, topologySpreadConstraints and priorityClassName, and the chart-wide
imagePullSecrets (`include "podcert.scheduling" (list .Values.shim .Values.imagePullSecrets)`).
Each only when set; callers trim it, so that nothing set leaves no blank line. */}}
{{- define "podcert.scheduling" -}}
{{- $values := index . 0 -}}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with index . 1 }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The NetworkPolicy's webhook peers, or a refusal to render: with none set the API server
cannot reach the webhook on a CNI that enforces NetworkPolicy, and `failurePolicy: Fail` then
refuses every request for the signer names. */}}
{{- define "podcert.webhookFrom" -}}
{{- if not .Values.networkPolicy.webhookFrom -}}
{{- fail "networkPolicy.webhookFrom is not set: give the API server's addresses (e.g. --set-json 'networkPolicy.webhookFrom=[{\"ipBlock\":{\"cidr\":\"10.0.0.10/32\"}}]'; the chart's README says which for kubeadm, managed and konnectivity control planes), or set networkPolicy.enabled=false if your CNI enforces no NetworkPolicy; without it the API server cannot reach the webhook and every request for the signer is refused" -}}
{{- end -}}
{{- toYaml .Values.networkPolicy.webhookFrom -}}
{{- end }}

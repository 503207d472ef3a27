(function(){var b=document.getElementById('toggle-explain');if(!b)return;b.hidden=false;
b.addEventListener('click',function(){var open=b.getAttribute('aria-pressed')!=='true';
document.querySelectorAll('details.explain').forEach(function(d){d.open=open;});
b.setAttribute('aria-pressed',open?'true':'false');
b.textContent=open?'Collapse every explanation':'Expand every explanation';});})();